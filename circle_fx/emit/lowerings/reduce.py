"""Reductions (MEAN, SUM, REDUCE_MAX) and softmax over the last axis."""
from __future__ import annotations

import torch

from ...circle import limits
from ...circle.dims import fold, numel, runs
from ...fx_utils import arguments
from ..registry import lowering
from ._common import BO, options

aten = torch.ops.aten

MAX_RANK = limits.REDUCE  # onert 0.1.0's MEAN / SUM / REDUCE_MAX take inputs of rank <= 4
_REDUCE = {aten.mean.dim: BO.MEAN, aten.sum.dim_IntList: BO.SUM, aten.amax.default: BO.REDUCE_MAX}


def _refused_reduction(info, node) -> str | None:
    """A sum with an int64 result (onert has no int64 SUM kernel) or a ``dtype=`` conversion."""
    if node.target in (aten.sum.dim_IntList, aten.sum.default) and info.dtype(node) == torch.int64:
        return ("a sum with an int64 result (torch sums bool and integer tensors as int64) is not "
                "supported: onert 0.1.0 has no int64 SUM kernel (it fails to load, or returns garbage "
                "when the input is int32); sum an int32 tensor as int32 (x.to(torch.int32).sum(-1, "
                "dtype=torch.int32)) or sum as float")
    if node.target in (aten.mean.dim, aten.sum.dim_IntList):
        dtype = arguments(node)[3]
        if dtype is not None and dtype != info.dtype(node.args[0]):
            return f"reduction with dtype={dtype} is not supported"
    return None


@lowering(*_REDUCE, refuses=_refused_reduction)
def reduce(ctx, node):
    args = arguments(node)
    x, dims, keepdim = args[0], args[1], args[2]
    rank = ctx.rank(x)
    if dims is None or len(dims) == 0:
        dims = list(range(rank))
    _emit_reduce(ctx, node, _REDUCE[node.target], x, sorted(d % rank for d in dims), bool(keepdim))


def _emit_reduce(ctx, node, code, x, axes, keepdim):
    reduce_into(ctx, code, ctx.tensor(x), x, axes, keepdim, ctx.output(node))


def reduce_into(ctx, code, src, x, axes, keepdim, out):
    """Reduce tensor ``src`` (shaped like node ``x``) over ``axes`` into tensor ``out``.

    onert's shape validator rejects most 4-D reductions with keepDims=False (only axes
    [3] and [1, 2] pass), so 4-D inputs reduce with keepDims=True and RESHAPE after; inputs
    of rank 5 or more are folded first (:func:`_reduce_folded`)."""
    if len(ctx.tensor_dims(src)) > MAX_RANK:
        _reduce_folded(ctx, code, src, axes, out)
        return
    if keepdim or ctx.rank(x) != 4 or len(axes) == 4:
        ctx.op(code, [src, ctx.int_const(axes, "axes")], [out], options("ReducerOptions", keepDims=keepdim))
        return
    kept = [1 if d in axes else s for d, s in enumerate(ctx.dims(x))]
    kept_hint = [1 if d in axes else s for d, s in enumerate(ctx.shape_hint(x))]
    tmp = ctx.new_tensor(kept, ctx.tensor_dtype(out), "keepdims", kept_hint)
    ctx.op(code, [src, ctx.int_const(axes, "axes")], [tmp], options("ReducerOptions", keepDims=True))
    ctx.op(BO.RESHAPE, [tmp, ctx.shape_operand(ctx.tensor_dims(out))], [out])


def _reduce_folded(ctx, code, src, axes, out):
    """onert 0.1.0 reduces inputs of rank <= 4 only (5-D: "ShapeValidator failed at line 304",
    findings §3). Consecutive dims that are all reduced or all kept are multiplied into one
    (row-major, so the RESHAPE is exact; static 1s are dropped), and the reduction runs on
    those runs. They alternate, so up to 4 runs fit; with more, a TRANSPOSE moves the kept
    runs in front of the reduced ones and the input becomes ``[kept, reduced]``."""
    src_dims, src_hint = ctx.tensor_dims(src), ctx.tensor_hint(src)
    groups = runs([d in axes for d in range(len(src_dims))], skip=lambda d: src_dims[d] == 1)
    if not any(red for red, _ in groups):  # only size-1 dims are reduced
        ctx.op(BO.RESHAPE, [src, ctx.shape_operand(ctx.tensor_dims(out))], [out])
        return
    folded, folded_hint = fold(src_dims, groups), fold(src_hint, groups)
    reduced = [red for red, _ in groups]
    dtype = ctx.tensor_dtype(src)
    if len(groups) > MAX_RANK:
        perm = [i for i, r in enumerate(reduced) if not r] + [i for i, r in enumerate(reduced) if r]
        grouped = ctx.reshaped(src, folded, folded_hint, "reduce_runs")
        moved = ctx.new_tensor([folded[p] for p in perm], dtype, "reduce_moved", [folded_hint[p] for p in perm])
        ctx.op(BO.TRANSPOSE, [grouped, ctx.int_const(perm, "perm")], [moved])
        src, reduced = moved, [False, True]
        folded = [numel(folded[i] for i, r in enumerate(groups) if r[0] == red) for red in reduced]
        folded_hint = [numel(folded_hint[i] for i, r in enumerate(groups) if r[0] == red) for red in reduced]
    src = ctx.reshaped(src, folded, folded_hint, "reduce_folded")
    folded_runs = list(zip(reduced, folded, folded_hint))
    keep = len(folded_runs) == 4  # onert's 4-D reductions need keepDims=True (see reduce_into)
    dims = [1 if red else s for red, s, _ in folded_runs if keep or not red]
    hint = [1 if red else h for red, _, h in folded_runs if keep or not red]
    red_axes = [i for i, r in enumerate(folded_runs) if r[0]]
    direct = dims == ctx.tensor_dims(out)
    tmp = out if direct else ctx.new_tensor(dims, ctx.tensor_dtype(out), "reduced", hint)
    ctx.op(code, [src, ctx.int_const(red_axes, "axes")], [tmp], options("ReducerOptions", keepDims=keep))
    if not direct:
        ctx.op(BO.RESHAPE, [tmp, ctx.shape_operand(ctx.tensor_dims(out))], [out])


@lowering(aten.mean.default, aten.sum.default, refuses=_refused_reduction)
def reduce_all(ctx, node):
    x = node.args[0]
    rank = ctx.rank(x)
    code = BO.MEAN if node.target is aten.mean.default else BO.SUM
    _emit_reduce(ctx, node, code, x, list(range(rank)), False)


def _refused_softmax(info, node) -> str | None:
    """onert's SOFTMAX / LOG_SOFTMAX reduce the last axis, in the input's dtype."""
    x, dim = node.args[0], node.args[1]
    rank = info.rank(x)
    if dim % max(rank, 1) != rank - 1:
        return f"softmax over axis {dim} is not supported (only the last axis)"
    if info.dtype(node) != info.dtype(x):
        return "softmax with a dtype change is not supported"
    return None


@lowering(aten._softmax.default, aten.softmax.int, aten._log_softmax.default, aten.log_softmax.int,
          refuses=_refused_softmax)
def softmax(ctx, node):
    x = node.args[0]
    if node.target in (aten._log_softmax.default, aten.log_softmax.int):
        ctx.op(BO.LOG_SOFTMAX, [ctx.tensor(x)], [ctx.output(node)])
    else:
        ctx.op(BO.SOFTMAX, [ctx.tensor(x)], [ctx.output(node)], options("SoftmaxOptions", beta=1.0))
