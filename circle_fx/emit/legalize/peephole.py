"""Peephole rewrites on the emitted operator list: layout ops the lowerings leave behind.

Each lowering is written for its own node, so neighbours produce layout work that the FX
graph never shows: FULLY_CONNECTED's RESHAPE back to N-D followed by the model's ``view``
into heads, the RESHAPE to ``[1, S, 1, in]`` in front of a 1x1 CONV_2D, a TRANSPOSE of the
last two dims feeding BATCH_MATMUL (``q @ k.transpose(-1, -2)``). Rules, all exact:

- RESHAPE of a RESHAPE's output reads the inner one's input (a reshape keeps element order);
- a static RESHAPE to its input's own shape disappears (its readers read the input);
- FULLY_CONNECTED flattens its input to ``[rows, in]`` itself: a RESHAPE in front of it that
  keeps the last dim is skipped (unless ``limits.fully_connected_input_problem`` says the
  kernel cannot take the unflattened input: a GGML block weight);
- BATCH_MATMUL reading a TRANSPOSE that swaps the last two dims reads the TRANSPOSE's input
  with ``adjointLhs``/``adjointRhs`` flipped;

then operators whose outputs nobody reads (and that are no graph output) are dropped.
``protected`` tensors (graph inputs and outputs) are never bypassed. O(operators).
``program.gm.meta[circle_fx.meta.PEEPHOLE] = False`` turns it off (benchmarks/onert_speed.py's
"today" form).
"""
from __future__ import annotations

from ...circle import limits
from ...circle.ggml import block_type
from ...meta import PEEPHOLE
from ..builder import BO, ModelBuilder

META_KEY = PEEPHOLE  # the name benchmarks/onert_speed.py uses


def _static(mb: ModelBuilder, t: int) -> list[int] | None:
    info = mb.tensors[t]
    return None if info.shape_signature is not None else info.shape


def simplify(mb: ModelBuilder, protected: set[int]) -> int:
    """Apply the rules above in place; return how many operators were removed."""
    producer = {}
    for op in mb.operators:
        for t in op.outputs:
            producer[t] = op
    rename: dict[int, int] = {}

    def source(t: int) -> int:
        while t in rename:
            t = rename[t]
        return t

    for op in mb.operators:
        op.inputs = [source(t) if t >= 0 else t for t in op.inputs]
        if op.code == BO.RESHAPE:
            inner = producer.get(op.inputs[0])
            if inner is not None and inner.code == BO.RESHAPE:
                op.inputs[0] = inner.inputs[0]
            x, y = op.inputs[0], op.outputs[0]
            if y not in protected and _static(mb, x) is not None and _static(mb, x) == _static(mb, y):
                rename[y] = x
        elif op.code == BO.FULLY_CONNECTED:
            inner = producer.get(op.inputs[0])
            if inner is not None and inner.code == BO.RESHAPE:
                src, mid = inner.inputs[0], op.inputs[0]
                s, m = mb.tensors[src].shape, mb.tensors[mid].shape
                if len(s) >= 2 and s[-1] == m[-1] and _static(mb, src) is not None and _static(mb, mid) is not None \
                        and limits.fully_connected_input_problem(s, block_type(mb.tensors[op.inputs[1]].type) is not None) is None:
                    op.inputs[0] = src
        elif op.code == BO.BATCH_MATMUL and op.options is not None:
            for k, flag in ((0, "adjointLhs"), (1, "adjointRhs")):
                inner = producer.get(op.inputs[k])
                if inner is not None and inner.code == BO.TRANSPOSE and _swaps_last_two(mb, inner):
                    op.inputs[k] = inner.inputs[0]
                    setattr(op.options, flag, not getattr(op.options, flag))
    return _drop_dead(mb, protected)


def _swaps_last_two(mb: ModelBuilder, transpose) -> bool:
    perm_t = transpose.inputs[1]
    buf = mb.tensors[perm_t].buffer
    perm = mb.buffers[buf] if buf else None
    if perm is None:
        return False
    perm = [int(p) for p in perm.reshape(-1)]
    r = len(perm)
    return r >= 2 and perm == list(range(r - 2)) + [r - 1, r - 2]


def _drop_dead(mb: ModelBuilder, protected: set[int]) -> int:
    read = {}
    for op in mb.operators:
        for t in op.inputs:
            read[t] = read.get(t, 0) + 1
    keep = []
    removed = 0
    for op in reversed(mb.operators):
        if any(read.get(t, 0) or t in protected for t in op.outputs):
            keep.append(op)
            continue
        removed += 1
        for t in op.inputs:
            read[t] = read.get(t, 0) - 1
    mb.operators = keep[::-1]
    return removed
