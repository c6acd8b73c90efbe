"""Advanced indexing ``x[idx]`` (``aten.index.Tensor``) with one index tensor -> GATHER.

MoE layers pick expert weights this way (``gate_up_proj[expert_ids]``). One index
tensor at dimension d, every other position ``None`` (a full slice), is exactly
GATHER on axis d; several index tensors (broadcast together) would need GATHER_ND,
which onert 0.1.0 does not implement: ``passes/flat_index.py`` rewrites them into one
flat index before emission, so only cases it cannot (symbolic shapes) reach this error.
onert's GATHER has no bool kernel: the ``types`` legalization step gathers a bool table as int32.

torch counts negative indices from the end; GATHER reads out of bounds instead. Constant
index tensors are wrapped at compile time; a run-time index tensor gets
``idx + size * (idx < 0)`` (onert's SELECT_V2 has no int64 kernel) unless it comes straight from an op whose result
is a position and so never negative (``topk``/``sort``/``max.dim`` indices, ``argmax``,
possibly reshaped or sliced on the way):
that is the MoE router case, which then costs no extra ops; so does ``arange`` (plus a
non-negative constant), the positions a transformers mask function indexes with.
Index tensors on dims along which the indexed tensor repeats (size 1, or expanded) are
dropped first (``positions[batch_idx, kv_idx]`` in transformers' mask functions).
Which values are positions, and which dims repeat, is dataflow over the graph: the
``index_facts`` analysis pass (:mod:`circle_fx.passes.index_facts`) finds it and leaves it in
``node.meta[INDEX_FACTS]``; this lowering only reads it.
"""
from __future__ import annotations

import numpy as np
import torch

from ...fx_utils import same_size, val
from ...meta import INDEX_FACTS, IndexFacts
from ..registry import lowering
from ..types import to_numpy
from ._common import BO, options

aten = torch.ops.aten

#: what a program that skipped ``finalize_pipeline`` (whose last pass writes the facts) gets:
#: nothing known, so every choice is the safe one
_NO_FACTS = IndexFacts()


@lowering(aten.index.Tensor)
def index(ctx, node):
    x, indices = node.args[0], node.args[1]
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    facts = ctx.annotation(node, INDEX_FACTS, _NO_FACTS)
    src, dims, hint, grow = None, ctx.dims(x), ctx.shape_hint(x), None
    if len(given) > 1:
        src, dims, hint, given, grow = _drop_repeated_indices(ctx, node, x, given, facts.repeated_dims)
    if len(given) != 1:
        raise ctx.error(f"indexing with {len(given)} index tensors is not supported (only one; "
                        "onert has no GATHER_ND)")
    axis, idx = given[0]
    axis_before = next(d for d, i in enumerate(indices) if i is idx)  # before any dims were dropped
    if ctx.dtype(idx) == torch.bool:
        raise ctx.error("boolean-mask indexing has a data-dependent shape and is not supported")
    # onert 0.1.0 GATHER: "unsupported input data type" for bool and int64 tables. The types
    # legalization step carries bool through int32 and stores int64 constant tables whose values
    # fit as int32 (DeepSeek-V4's token -> expert hash table), as for every op. What it cannot
    # know is that a run-time int64 table holds positions or counts (bounded by a dim's size, so
    # int32 is exact): the index_facts analysis does, so that narrowing is here.
    narrow = ctx.dtype(x) == torch.int64 and facts.table_counts_positions \
        and (src is not None or ctx.constant(x) is None)
    src = ctx.tensor(x) if src is None else src
    work = torch.int32 if narrow else ctx.dtype(node)
    if narrow:
        small = ctx.new_tensor(dims, torch.int32, "positions32", hint)
        ctx.op(BO.CAST, [src], [small])
        src = small
    out = ctx.output(node)
    picked = out if work == ctx.dtype(node) and grow is None else ctx.like(node, "picked", work)
    if grow is not None:  # GATHER gives the kept index's shape; the dropped ones broadcast it
        picked = ctx.new_tensor(grow[0], work, "picked", grow[1])
    ctx.op(BO.GATHER, [src, _index(ctx, x, dims, hint, axis, idx, axis_before in facts.never_negative)], [picked],
           options("GatherOptions", axis=axis, batchDims=0))
    if grow is not None:
        zeros_shape = [w if p == 1 else 1 for p, w in zip(grow[0], ctx.shape_hint(node))]
        zeros = ctx.const(np.zeros(zeros_shape, to_numpy(torch.zeros((), dtype=work)).dtype), "broadcast")
        grown = out if work == ctx.dtype(node) else ctx.like(node, "grown", work)
        ctx.op(BO.ADD, [picked, zeros], [grown], options("AddOptions"))
        picked = grown
    if picked != out:
        ctx.op(BO.CAST, [picked], [out])


def _drop_repeated_indices(ctx, node, x, given, repeated):
    """Index tensors on dims along which every slice of ``x`` is the same select nothing:
    slice 0 of that dim is as good (STRIDED_SLICE with shrink). Such dims (``repeated``) are
    static size-1 dims and dims that an ``expand`` repeated, followed through elementwise and
    row-wise ops (the ``index_facts`` analysis, :mod:`circle_fx.passes.index_facts`). transformers' mask functions index
    ``positions[batch_idx, kv_idx]`` with ``positions = arange(S).expand(B, -1)`` (and a
    cumsum over it); dropping ``batch_idx`` leaves one index tensor (GATHER). The dropped
    indices' shapes still broadcast the result: ``grow`` is then the GATHER's own
    ``(dims, hint)``, broadcast by the caller with an ADD of zeros (static dims only).

    Returns ``(tensor, dims, hint, given, grow)`` of the sliced source; ``tensor`` is None
    (nothing emitted, ``given`` unchanged) when this does not apply."""
    unchanged = (None, ctx.dims(x), ctx.shape_hint(x), given, None)
    shape = list(val(x).shape)
    drop = [d for d, i in given if d in repeated]
    keep = [(d, i) for d, i in given if d not in drop]
    if len(keep) != 1 or not drop:
        return unchanged
    axis, idx = keep[0]
    order = sorted(d for d, _ in given)
    adjacent = order == list(range(order[0], order[-1] + 1))
    new_axis = axis - sum(1 for d in drop if d < axis)
    squeezed = [s for d, s in enumerate(shape) if d not in drop]
    result = squeezed[:new_axis] + list(val(idx).shape) + squeezed[new_axis + 1:]
    want = list(val(node).shape)
    if len(result) != len(want) or not (adjacent or new_axis == 0):
        return unchanged
    grow = None
    if not all(same_size(a, b) for a, b in zip(result, want)):
        if not all(same_size(a, b) or (same_size(a, 1) and isinstance(b, int)) for a, b in zip(result, want)):
            return unchanged
        if ctx.dtype(node) == torch.bool:
            return unchanged
        grow = ([d if isinstance(d, int) else -1 for d in result],
                [d if isinstance(d, int) else _hint(d) for d in result])
    full_dims, full_hint = ctx.dims(x), ctx.shape_hint(x)
    rank = len(full_dims)
    dims = [d for i, d in enumerate(full_dims) if i not in drop]
    hint = [h for i, h in enumerate(full_hint) if i not in drop]
    out = ctx.new_tensor(dims, ctx.dtype(x), "first", hint)
    shrink = sum(1 << d for d in drop)
    ends = [1 if d in drop else 0 for d in range(rank)]
    ctx.op(BO.STRIDED_SLICE, [ctx.tensor(x), ctx.int_const([0] * rank, "begin"), ctx.int_const(ends, "end"),
                              ctx.int_const([1] * rank, "strides")], [out],
           options("StridedSliceOptions", beginMask=0, endMask=((1 << rank) - 1) & ~shrink, shrinkAxisMask=shrink))
    return out, dims, hint, [(new_axis, idx)], grow


def _hint(size: torch.SymInt) -> int:
    try:
        return int(size.node.hint) if size.node.hint is not None else 1
    except Exception:
        return 1


def _index(ctx, x, dims, hint, axis, idx, never_negative: bool):
    """The index tensor with negative entries wrapped (see the module docstring); ``dims`` and
    ``hint`` are those of the indexed tensor (``x`` itself, or ``x`` with repeated dims dropped);
    ``never_negative``: the analysis found its values are positions."""
    size = hint[axis]
    dynamic = dims[axis] == -1
    t = ctx.constant(idx)
    if t is not None:
        if not bool((t < 0).any()):
            return ctx.tensor(idx)
        if dynamic:
            raise ctx.error(f"negative indices into dynamic dim {axis} of %{x.name} are not supported")
        return ctx.const(to_numpy(torch.where(t < 0, t + size, t)), "index")
    if never_negative:
        return ctx.tensor(idx)
    if dynamic:
        raise ctx.error(f"run-time indices into dynamic dim {axis} of %{x.name} may be negative, which "
                        "cannot be wrapped without the dim's size; index a static dim instead")
    dt = ctx.dtype(idx)
    raw = ctx.tensor(idx)
    zero = ctx.const(np.array(0, dtype=to_numpy(torch.zeros((), dtype=dt)).dtype), "zero")
    negative = ctx.like(idx, "negative", torch.bool)
    ctx.op(BO.LESS, [raw, zero], [negative])
    as_int = ctx.like(idx, "negative_int")
    ctx.op(BO.CAST, [negative], [as_int])
    offset = ctx.like(idx, "offset")
    ctx.op(BO.MUL, [as_int, ctx.tensor(size, dt)], [offset], options("MulOptions"))
    wrapped = ctx.like(idx, "wrapped")
    ctx.op(BO.ADD, [raw, offset], [wrapped], options("AddOptions"))
    return wrapped
