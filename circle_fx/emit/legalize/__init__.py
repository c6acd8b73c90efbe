"""The legalization stage: the lowered Circle operators brought within what onert 0.1.0 runs.

Lowerings emit plain Circle for their node; what onert cannot run as emitted (an element type
without a kernel, a rank its kernel refuses or miscomputes, a form it refuses: a constant
matmul lhs, a dynamic RMS_NORM, ROPE tables of several positions, an N-D input to a GGML-weight
FULLY_CONNECTED, int64 or N-D ids into a GGML table; a graph output that later
operators read) is fixed here, on the operator list, by named steps run in the declared order
of :data:`STEPS`. Every limit is read from the Circle op table (``circle/op_table.py``: its
``types``, ``rank`` and ``forms``, the checks in ``circle/limits.py``), the same table
``verify`` reports with.

After each step, :func:`check` confirms what the steps so far promise (``ensures``): every
operator's element types after ``types``, its ranks after ``ranks``, each form limit after its
step; a step that leaves an operator beyond the limits raises a
:class:`~circle_fx.errors.LegalizeError` naming the step, the operators and their model lines,
instead of a file that fails (or silently miscomputes) in onert.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...circle import op_table
from ...circle.limits import INDEX_CLAMPS
from ...circle.op_table import ELEMENT_TYPES, Operand, data_inputs, form_problems, rank_problem, unsupported_type
from ...circle.schema import type_name
from ...errors import LegalizeError
from .. import index_limits
from ..builder import ModelBuilder, op_name
from . import forms, outputs, peephole, ranks, types

#: what a step establishes for every operator (checked after it and after every later step);
#: a form limit's name (``op_table.CONSTANT_LHS[0]``...) is what its step ensures
TYPES, RANKS = "element types", "ranks"


@dataclass(frozen=True)
class Step:
    name: str
    #: ``run(mb, protected)``: rewrite ``mb.operators`` in place (``protected``: graph input
    #: and output tensors, which no step may bypass)
    run: Callable[[ModelBuilder, set], object]
    ensures: frozenset = frozenset()
    #: False: a step the caller may skip (the peephole, a speed step:
    #: ``program.gm.meta[peephole.META_KEY]``; index clamps: ``clamp_indices=False``)
    required: bool = True
    #: run instead when the step is skipped (None: nothing)
    when_skipped: Callable[[ModelBuilder, set], object] | None = None


def _form(limit: tuple, rewrite) -> Step:
    """The step of a form limit of the op table: named after it, ensuring it."""
    return Step(limit[0], lambda mb, _: rewrite(mb), frozenset({limit[0]}))


STEPS: tuple[Step, ...] = (
    # first: their operators (TRANSPOSE, MEAN, STRIDED_SLICE...) have type and rank limits
    _form(op_table.CONSTANT_LHS, forms.constant_lhs),
    _form(op_table.DYNAMIC_RMS_NORM, forms.dynamic_rms_norm),
    _form(op_table.ROPE_POSITIONS, forms.rope_positions),
    _form(op_table.GGML_ROWS, forms.ggml_rows),
    _form(op_table.GGML_BIAS, forms.ggml_bias),
    _form(op_table.GGML_GATHER_IDS, forms.ggml_gather_ids),
    # its CASTs are elementwise operators, which the rank step then folds
    Step("types", lambda mb, _: types.legalize(mb), frozenset({TYPES})),
    # correctness, not speed: always, before the peephole merges the RESHAPEs it adds
    Step("ranks", lambda mb, _: ranks.legalize(mb), frozenset({RANKS})),
    Step("peephole", peephole.simplify, required=False),
    # after the peephole, which would bypass what they add; skipped, the ranges are still recorded
    Step(INDEX_CLAMPS, lambda mb, _: index_limits.guard_indices(mb, clamp=True), frozenset({INDEX_CLAMPS}),
         required=False, when_skipped=lambda mb, _: index_limits.guard_indices(mb, clamp=False)),
    Step(outputs.OUTPUT_COPIES, outputs.copy_outputs, frozenset({outputs.OUTPUT_COPIES})),
)


def legalize(mb: ModelBuilder, protected: set[int], skip=frozenset()) -> None:
    """Run :data:`STEPS` in order on ``mb`` but the optional ones named in ``skip``,
    :func:`check` after each."""
    unknown = set(skip) - {s.name for s in STEPS if not s.required}
    if unknown:
        raise ValueError(f"only optional legalization steps can be skipped, not {sorted(unknown)}")
    ensured: set = set()
    for step in STEPS:
        if step.name in skip:
            if step.when_skipped is not None:
                step.when_skipped(mb, protected)
            continue
        step.run(mb, protected)
        ensured |= step.ensures
        check(mb, step.name, ensured)


def check(mb: ModelBuilder, step: str, ensured) -> None:
    """Raise a :class:`LegalizeError` naming ``step`` when an operator breaks a limit in
    ``ensured`` (:data:`TYPES`, :data:`RANKS`, a form limit's name, :data:`outputs.OUTPUT_COPIES`,
    ``limits.INDEX_CLAMPS``: no GATHER reads a graph input's values unclamped)."""
    if not ensured:
        return
    problems, ops = [], []
    if outputs.OUTPUT_COPIES in ensured:
        problems += outputs.problems(mb)
    if INDEX_CLAMPS in ensured:
        problems += index_limits.problems(mb)
    for k, op in enumerate(mb.operators):
        name = op_name(op.code)
        msg = None
        if TYPES in ensured:
            data = [op.inputs[p] for p in data_inputs(name, len(op.inputs)) if op.inputs[p] >= 0] \
                if name in ELEMENT_TYPES else []
            if data and not any(mb.tensors[t].quantization is not None for t in data):
                bad = unsupported_type(name, [type_name(mb.tensors[t].type) for t in data])
                msg = f"input type {bad}: onert 0.1.0's {name} does not run it" if bad else None
        spec = op_table.row(op.code)
        if msg is None and RANKS in ensured and spec is not None:
            axes = mb.values(op.inputs[1]).ravel().tolist() \
                if spec.reads_axes and len(op.inputs) > 1 and mb.tensors[op.inputs[1]].buffer else None
            msg = rank_problem(name, [mb.dims(t) if t >= 0 else [] for t in op.inputs],
                               mb.dims(op.outputs[0]) if op.outputs else [], axes)
        if msg is None and spec is not None and spec.forms:
            found = form_problems(name, [_operand(mb, t) for t in op.inputs], [_operand(mb, t) for t in op.outputs],
                                  only=ensured)
            msg = "; ".join(f"{limit}: {m}" for limit, m in found) or None
        if msg:
            problems.append(f"operator {k} {name}{op.where}: {msg}")
            ops.append((name, "", op.source or ""))
    if problems:
        raise LegalizeError(
            f"after the {step!r} legalization step, {len(problems)} operator(s) are still beyond what onert "
            f"0.1.0 runs (circle/op_table.py):\n  " + "\n  ".join(problems[:20])
            + ("\n  ..." if len(problems) > 20 else ""), step, problems, ops)


def _operand(mb: ModelBuilder, t: int) -> Operand:
    if t < 0:
        return Operand([], "", False)
    return Operand(mb.dims(t), type_name(mb.tensors[t].type), bool(mb.tensors[t].buffer))
