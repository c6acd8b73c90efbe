"""The legalization stage: the lowered Circle operators brought within what onert 0.1.0 runs.

Lowerings emit plain Circle for their node; what onert cannot run as emitted (an element type
without a kernel, a rank its kernel refuses or miscomputes) is fixed here, on the operator list,
by named steps run in the declared order of :data:`STEPS`. Every limit is read from
``circle/limits.py`` (:func:`~circle_fx.circle.limits.rank_problem`,
:func:`~circle_fx.circle.limits.unsupported_type`), the same functions ``verify`` reports with.

After each step, :func:`check` confirms what the steps so far promise (``ensures``): every
operator's element types after ``types``, its ranks too after ``ranks``; a step that leaves an
operator beyond the limits raises a :class:`~circle_fx.errors.LegalizeError` naming the step,
the operators and their model lines, instead of a file that fails (or silently miscomputes)
in onert.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...circle.limits import ELEMENT_TYPES, REDUCTIONS, data_inputs, rank_problem, unsupported_type
from ...circle.schema import type_name
from ...errors import LegalizeError
from ..builder import ModelBuilder, op_name
from . import peephole, ranks, types

#: what a step establishes for every operator (checked after it and after every later step)
TYPES, RANKS = "element types", "ranks"


@dataclass(frozen=True)
class Step:
    name: str
    #: ``run(mb, protected)``: rewrite ``mb.operators`` in place (``protected``: graph input
    #: and output tensors, which no step may bypass)
    run: Callable[[ModelBuilder, set], object]
    ensures: frozenset = frozenset()
    #: False: a speed step the caller may turn off (``program.gm.meta[peephole.META_KEY]``)
    required: bool = True


STEPS: tuple[Step, ...] = (
    # first: its CASTs are elementwise operators, which the rank step then folds
    Step("types", lambda mb, _: types.legalize(mb), frozenset({TYPES})),
    # correctness, not speed: always, before the peephole merges the RESHAPEs it adds
    Step("ranks", lambda mb, _: ranks.legalize(mb), frozenset({RANKS})),
    Step("peephole", peephole.simplify, required=False),
)


def legalize(mb: ModelBuilder, protected: set[int], optional: bool = True) -> None:
    """Run :data:`STEPS` in order on ``mb`` (``optional=False`` skips the speed steps),
    :func:`check` after each."""
    ensured: set = set()
    for step in STEPS:
        if not (step.required or optional):
            continue
        step.run(mb, protected)
        ensured |= step.ensures
        check(mb, step.name, ensured)


def check(mb: ModelBuilder, step: str, ensured) -> None:
    """Raise a :class:`LegalizeError` naming ``step`` when an operator breaks a limit in
    ``ensured`` (:data:`TYPES`, :data:`RANKS`)."""
    if not ensured:
        return
    problems, ops = [], []
    for k, op in enumerate(mb.operators):
        name = op_name(op.code)
        msg = None
        if TYPES in ensured:
            data = [op.inputs[p] for p in data_inputs(name, len(op.inputs)) if op.inputs[p] >= 0] \
                if name in ELEMENT_TYPES else []
            if data and not any(mb.tensors[t].quantization is not None for t in data):
                bad = unsupported_type(name, [type_name(mb.tensors[t].type) for t in data])
                msg = f"input type {bad}: onert 0.1.0's {name} does not run it" if bad else None
        if msg is None and RANKS in ensured:
            axes = mb.values(op.inputs[1]).ravel().tolist() \
                if name in REDUCTIONS and len(op.inputs) > 1 and mb.tensors[op.inputs[1]].buffer else None
            msg = rank_problem(name, [mb.dims(t) if t >= 0 else [] for t in op.inputs],
                               mb.dims(op.outputs[0]) if op.outputs else [], axes)
        if msg:
            problems.append(f"operator {k} {name}{op.where}: {msg}")
            ops.append((name, "", op.source or ""))
    if problems:
        raise LegalizeError(
            f"after the {step!r} legalization step, {len(problems)} operator(s) are still beyond what onert "
            f"0.1.0 runs (circle/limits.py):\n  " + "\n  ".join(problems[:20])
            + ("\n  ..." if len(problems) > 20 else ""), step, problems, ops)
