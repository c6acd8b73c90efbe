"""Reductions (MEAN, SUM, REDUCE_MAX) and softmax over the last axis."""
from __future__ import annotations

import torch

from ...fx_utils import arguments
from ..registry import lowering
from ._common import BO, options

aten = torch.ops.aten

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
    reduce_into(ctx, _REDUCE[node.target], ctx.tensor(x), sorted(d % rank for d in dims), bool(keepdim),
                ctx.output(node))


def reduce_into(ctx, code, src, axes, keepdim, out):
    """Reduce tensor ``src`` over ``axes`` into tensor ``out``: plain Circle at any rank (the
    ``ranks`` legalization step folds what onert cannot run: ``emit/legalize/axes.py``)."""
    ctx.op(code, [src, ctx.int_const(axes, "axes")], [out], options("ReducerOptions", keepDims=keepdim))


@lowering(aten.mean.default, aten.sum.default, refuses=_refused_reduction)
def reduce_all(ctx, node):
    x = node.args[0]
    rank = ctx.rank(x)
    code = BO.MEAN if node.target is aten.mean.default else BO.SUM
    reduce_into(ctx, code, ctx.tensor(x), list(range(rank)), False, ctx.output(node))


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
