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
    rank = len(ctx.static_shape(x))
    if dims is None or len(dims) == 0:
        dims = list(range(rank))
    if node.target in (aten.mean.dim, aten.sum.dim_IntList) and args[3] is not None and args[3] != ctx.dtype(x):
        raise ctx.error(f"reduction with dtype={args[3]} is not supported")
    ctx.op(_REDUCE[node.target], [ctx.tensor(x), ctx.int_const(sorted(d % rank for d in dims), "axes")],
           [ctx.output(node)], options("ReducerOptions", keepDims=bool(keepdim)))


@lowering(aten.mean.default, aten.sum.default)
def reduce_all(ctx, node):
    x = node.args[0]
    rank = len(ctx.static_shape(x))
    code = BO.MEAN if node.target is aten.mean.default else BO.SUM
    ctx.op(code, [ctx.tensor(x), ctx.int_const(list(range(rank)), "axes")], [ctx.output(node)],
           options("ReducerOptions", keepDims=False))


@lowering(aten._softmax.default, aten.softmax.int, aten._log_softmax.default, aten.log_softmax.int)
def softmax(ctx, node):
    x, dim = node.args[0], node.args[1]
    rank = len(ctx.static_shape(x))
    if dim % rank != rank - 1:
        raise ctx.error(f"softmax over axis {dim} is not supported (only the last axis)")
    if ctx.dtype(node) != ctx.dtype(x):
        raise ctx.error("softmax with a dtype change is not supported")
    if node.target in (aten._log_softmax.default, aten.log_softmax.int):
        ctx.op(BO.LOG_SOFTMAX, [ctx.tensor(x)], [ctx.output(node)])
    else:
        ctx.op(BO.SOFTMAX, [ctx.tensor(x)], [ctx.output(node)], options("SoftmaxOptions", beta=1.0))
