"""Reductions (MEAN, SUM, REDUCE_MAX) and softmax over the last axis."""
from __future__ import annotations

import torch

from ...fx_utils import arguments
from ..registry import lowering
from ._common import BO, options

aten = torch.ops.aten

_REDUCE = {aten.mean.dim: BO.MEAN, aten.sum.dim_IntList: BO.SUM, aten.amax.default: BO.REDUCE_MAX}


@lowering(*_REDUCE)
def reduce(ctx, node):
    args = arguments(node)
    x, dims, keepdim = args[0], args[1], args[2]
    rank = ctx.rank(x)
    if dims is None or len(dims) == 0:
        dims = list(range(rank))
    if node.target in (aten.mean.dim, aten.sum.dim_IntList) and args[3] is not None and args[3] != ctx.dtype(x):
        raise ctx.error(f"reduction with dtype={args[3]} is not supported")
    _emit_reduce(ctx, node, _REDUCE[node.target], x, sorted(d % rank for d in dims), bool(keepdim))


def _emit_reduce(ctx, node, code, x, axes, keepdim):
    """onert's shape validator rejects most 4-D reductions with keepDims=False (only axes
    [3] and [1, 2] pass), so 4-D inputs reduce with keepDims=True and RESHAPE after."""
    if keepdim or ctx.rank(x) != 4 or len(axes) == 4:
        ctx.op(code, [ctx.tensor(x), ctx.int_const(axes, "axes")], [ctx.output(node)],
               options("ReducerOptions", keepDims=keepdim))
        return
    shape, sig = ctx.shape_of(x)
    kept = [1 if d in axes else s for d, s in enumerate(shape)]
    kept_sig = [1 if d in axes else s for d, s in enumerate(sig)] if sig is not None else None
    tmp = ctx.new_tensor(kept, ctx.dtype(node), "keepdims", kept_sig)
    ctx.op(code, [ctx.tensor(x), ctx.int_const(axes, "axes")], [tmp], options("ReducerOptions", keepDims=True))
    ctx.op(BO.RESHAPE, [tmp, ctx.shape_operand(node)], [ctx.output(node)])


@lowering(aten.mean.default, aten.sum.default)
def reduce_all(ctx, node):
    x = node.args[0]
    rank = ctx.rank(x)
    code = BO.MEAN if node.target is aten.mean.default else BO.SUM
    _emit_reduce(ctx, node, code, x, list(range(rank)), False)


@lowering(aten._softmax.default, aten.softmax.int, aten._log_softmax.default, aten.log_softmax.int)
def softmax(ctx, node):
    x, dim = node.args[0], node.args[1]
    rank = ctx.rank(x)
    if dim % rank != rank - 1:
        raise ctx.error(f"softmax over axis {dim} is not supported (only the last axis)")
    if ctx.dtype(node) != ctx.dtype(x):
        raise ctx.error("softmax with a dtype change is not supported")
    if node.target in (aten._log_softmax.default, aten.log_softmax.int):
        ctx.op(BO.LOG_SOFTMAX, [ctx.tensor(x)], [ctx.output(node)])
    else:
        ctx.op(BO.SOFTMAX, [ctx.tensor(x)], [ctx.output(node)], options("SoftmaxOptions", beta=1.0))
