"""Rank folds of operators that work along axes: reductions and strided slices (``ranks`` step).

The lowerings emit MEAN / SUM / REDUCE_MAX and STRIDED_SLICE at the tensor's own rank, with
torch's keep-dims choice; what onert 0.1.0 cannot run as emitted is rewritten here, on the
operator list (docs/onert-findings.md, "Ranks above 4"):

- a reduction of an input above rank ``limits.REDUCE`` fails at prepare ("ShapeValidator
  failed at line 304"): neighbouring dims that are all reduced or all kept are multiplied into
  one (size-1 dims drop); they alternate, so up to four runs fit, and with more a TRANSPOSE
  moves the kept runs in front of the reduced ones (``[kept, reduced]``);
- a 4-D reduction to rank 2 or 3 (``keepDims=False``) fails at prepare for most axes
  (``limits.REDUCE_DROPS_DIMS``): it reduces with ``keepDims=True`` and RESHAPEs after;
- a STRIDED_SLICE of an input above rank ``limits.STRIDED_SLICE`` fails at prepare ("line
  969"): dims taken whole are merged into runs, each sliced dim stays its own dim.

Row-major order is unchanged by every merge, so each RESHAPE is exact. An operator these
folds cannot bring within its limit (run-time axes or bounds, several dynamic dims in one
run) is left as it is, and the check after the step names it.
"""
from __future__ import annotations

import numpy as np

from ...circle import dims, limits, op_table
from ...circle.schema import make_options as options
from ..builder import BO, ModelBuilder, OperatorInfo, op_name


def fold_reduce(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    """A MEAN / SUM / REDUCE_MAX within onert's rank and keep-dims limits (None: it is)."""
    x, axes_t = op.inputs[:2]
    out_t = op.outputs[0]
    xd = mb.dims(x)
    keep = bool(op.options.keepDims) if op.options is not None else False
    if not xd or not mb.tensors[axes_t].buffer:
        return None
    axes = sorted({int(a) % len(xd) for a in np.ravel(mb.values(axes_t))})
    if len(xd) <= limits.REDUCE:  # within rank: only a 4-D one that drops dims may need a fix
        if not keep and op_table.rank_problem(op_name(op.code), [xd], mb.dims(out_t), axes):
            return _keeping_dims(mb, op, x, axes_t, axes, out_t)
        return None
    groups = dims.runs([d in axes for d in range(len(xd))], skip=lambda d: xd[d] == 1)
    if not any(red for red, _ in groups):  # only size-1 dims are reduced
        return [mb.reshape_into(x, out_t, op.source)]
    folded, hint = dims.fold(xd, groups), dims.fold(mb.tensors[x].shape, groups)
    reduced = [red for red, _ in groups]
    new_ops: list[OperatorInfo] = []
    src = x
    if len(groups) > limits.REDUCE:
        perm = [i for i, r in enumerate(reduced) if not r] + [i for i, r in enumerate(reduced) if r]
        if folded.count(-1) > 1:
            return None
        grouped, ops = mb.reshaped(x, folded, hint, f"{mb.tensors[x].name}/reduce_runs", op.source)
        moved = mb.like(x, [folded[p] for p in perm], [hint[p] for p in perm], f"{mb.tensors[x].name}/reduce_moved")
        new_ops += ops + [OperatorInfo(BO.TRANSPOSE, [grouped, _int32(mb, moved, "perm", perm)], [moved], None,
                                       op.source)]
        src, reduced = moved, [False, True]
        folded = [dims.numel(folded[i] for i, r in enumerate(groups) if r[0] == red) for red in reduced]
        hint = [dims.numel(hint[i] for i, r in enumerate(groups) if r[0] == red) for red in reduced]
    if folded.count(-1) > 1:
        return None
    src, ops = mb.reshaped(src, folded, hint, f"{mb.tensors[x].name}/reduce_folded", op.source)
    new_ops += ops
    sig = [s for s, red in zip(folded, reduced) if not red]
    sig_hint = [h for h, red in zip(hint, reduced) if not red]
    axes_c = _int32(mb, out_t, "axes", [i for i, red in enumerate(reduced) if red])
    direct = sig == mb.dims(out_t)
    if not direct and sig.count(-1) > 1:
        return None
    mid = out_t if direct else mb.like(out_t, sig, sig_hint, f"{mb.tensors[out_t].name}/reduced")
    # a new operator: the fold applies to it in turn (a 4-D result of four runs keeps its dims)
    new_ops.append(OperatorInfo(op.code, [src, axes_c], [mid], options("ReducerOptions", keepDims=False), op.source))
    if not direct:
        new_ops.append(mb.reshape_into(mid, out_t, op.source))
    return new_ops


def _keeping_dims(mb, op, x, axes_t, axes, out_t) -> list[OperatorInfo]:
    kept = [1 if d in axes else s for d, s in enumerate(mb.dims(x))]
    hint = [1 if d in axes else s for d, s in enumerate(mb.tensors[x].shape)]
    mid = mb.like(out_t, kept, hint, f"{mb.tensors[out_t].name}/keepdims")
    return [OperatorInfo(op.code, [x, axes_t], [mid], options("ReducerOptions", keepDims=True), op.source),
            mb.reshape_into(mid, out_t, op.source)]


#: the run key of a dim a slice takes whole (a sliced dim's key is its position)
WHOLE = "whole"


def fold_strided_slice(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    """A STRIDED_SLICE above rank ``limits.STRIDED_SLICE`` on runs of whole dims and its sliced
    dims (None: within the limit, or not foldable: the check names it)."""
    x, out_t = op.inputs[0], op.outputs[0]
    xd, out = mb.dims(x), mb.dims(out_t)
    rank = len(xd)
    o = op.options
    if rank <= limits.STRIDED_SLICE or 0 in out or out.count(-1) > 1 or len(op.inputs) != 4:
        return None
    if not all(mb.tensors[t].buffer for t in op.inputs[1:]) or (o is not None and (o.ellipsisMask or o.newAxisMask)):
        return None
    begin, end, stride = ([int(v) for v in np.ravel(mb.values(t))] for t in op.inputs[1:])
    bit = lambda mask, k: bool(o is not None and getattr(o, mask) >> k & 1)  # noqa: E731
    shrink = [bit("shrinkAxisMask", k) for k in range(rank)]
    for k in range(rank):  # a shrunk axis takes one index; static negative ones counted from the end
        if shrink[k] and begin[k] < 0:
            if xd[k] == -1:
                return None
            begin[k] += xd[k]

    def whole(k):
        starts = bit("beginMask", k) or begin[k] == 0
        ends = bit("endMask", k) or (xd[k] != -1 and end[k] >= xd[k]) or shrink[k]
        return stride[k] == 1 and starts and ends and (not shrink[k] or xd[k] == 1)

    groups = dims.runs([WHOLE if whole(k) else k for k in range(rank)], skip=lambda k: xd[k] == 1)
    if all(key == WHOLE for key, _ in groups):  # every element kept: a RESHAPE
        return [mb.reshape_into(x, out_t, op.source)]
    if len(groups) > limits.STRIDED_SLICE:
        return None
    folded, hint = dims.fold(xd, groups), dims.fold(mb.tensors[x].shape, groups)
    out_iter, hint_iter = iter(out), iter(mb.tensors[out_t].shape)
    full_out = [1 if s else next(out_iter) for s in shrink]
    full_hint = [1 if s else next(hint_iter) for s in shrink]
    sig, sig_hint = dims.fold(full_out, groups), dims.fold(full_hint, groups)
    if folded.count(-1) > 1 or sig.count(-1) > 1:
        return None
    b, e, st, bmask, emask = [], [], [], 0, 0
    for g, (key, _) in enumerate(groups):
        if key == WHOLE:
            b, e, st = b + [0], e + [0], st + [1]
            bmask, emask = bmask | 1 << g, emask | 1 << g
        else:
            b.append(begin[key])
            e.append(begin[key] + 1 if shrink[key] else end[key])
            st.append(1 if shrink[key] else stride[key])
            bmask |= bit("beginMask", key) << g
            emask |= (bit("endMask", key) and not shrink[key]) << g
    src, new_ops = mb.reshaped(x, folded, hint, f"{mb.tensors[x].name}/slice_in", op.source)
    mid = mb.like(out_t, sig, sig_hint, f"{mb.tensors[out_t].name}/slice_out")
    consts = [_int32(mb, out_t, name, v) for name, v in (("begin", b), ("end", e), ("strides", st))]
    new_ops.append(OperatorInfo(BO.STRIDED_SLICE, [src, *consts], [mid],
                                options("StridedSliceOptions", beginMask=bmask, endMask=emask), op.source))
    new_ops.append(mb.reshape_into(mid, out_t, op.source))
    return new_ops


def _int32(mb: ModelBuilder, t: int, name: str, values) -> int:
    return mb.add_constant(f"{mb.tensors[t].name}/{name}", np.asarray(values, np.int32))
