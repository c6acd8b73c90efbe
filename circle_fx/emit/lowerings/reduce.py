"""Reductions (MEAN, SUM, REDUCE_MAX) and softmax over the last axis."""
from __future__ import annotations

import math

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
    if code == BO.SUM and ctx.dtype(node) == torch.int64:
        raise ctx.error("a sum with an int64 result (torch sums bool and integer tensors as int64) is not "
                        "supported: onert 0.1.0 has no int64 SUM kernel (it fails to load, or returns garbage "
                        "when the input is int32); sum as int32 (x.sum(dtype=torch.int32)) or as float")
    reduce_into(ctx, code, ctx.tensor(x), x, axes, keepdim, ctx.output(node))


def reduce_into(ctx, code, src, x, axes, keepdim, out):
    """Reduce tensor ``src`` (shaped like node ``x``) over ``axes`` into tensor ``out``.

    onert's shape validator rejects most 4-D reductions with keepDims=False (only axes
    [3] and [1, 2] pass), so 4-D inputs reduce with keepDims=True and RESHAPE after."""
    if ctx.rank(x) > 4:
        _reduce_merged(ctx, code, src, x, axes, out)
        return
    if keepdim or ctx.rank(x) != 4 or len(axes) == 4:
        ctx.op(code, [src, ctx.int_const(axes, "axes")], [out], options("ReducerOptions", keepDims=keepdim))
        return
    kept = [1 if d in axes else s for d, s in enumerate(ctx.dims(x))]
    kept_hint = [1 if d in axes else s for d, s in enumerate(ctx.shape_hint(x))]
    tmp = ctx.new_tensor(kept, ctx.tensor_dtype(out), "keepdims", kept_hint)
    ctx.op(code, [src, ctx.int_const(axes, "axes")], [tmp], options("ReducerOptions", keepDims=True))
    ctx.op(BO.RESHAPE, [tmp, ctx.shape_operand(ctx.tensor_dims(out))], [out])


def _reduce_merged(ctx, code, src, x, axes, out):
    """A reduction of a 5-D (or more) tensor (xLSTM's chunked ``[b, heads, chunks, l, l]``):
    onert reduces rank <= 4 only ("ShapeValidator failed at line 304"), so neighbouring dims
    that are all reduced or all kept are merged first (a RESHAPE, free), reduced with
    keepDims=True, and the result reshaped to the output."""
    dims, hint = ctx.dims(x), ctx.shape_hint(x)
    groups: list[list[int]] = []
    for d in range(len(dims)):
        if groups and (groups[-1][-1] in axes) == (d in axes):
            groups[-1].append(d)
        else:
            groups.append([d])
    if len(groups) > 4:
        raise ctx.error(f"reducing axes {axes} of a {len(dims)}-D tensor {dims}: onert reduces at most 4-D tensors and "
                        "these axes do not merge into 4 dims")

    def merged(sizes, g):
        return -1 if any(sizes[d] == -1 for d in g) else math.prod(sizes[d] for d in g)

    shape = [merged(dims, g) for g in groups]
    shape_hint = [math.prod(hint[d] for d in g) for g in groups]
    flat = ctx.new_tensor(shape, ctx.tensor_dtype(src), "merged", shape_hint)
    ctx.op(BO.RESHAPE, [src, ctx.shape_operand(shape)], [flat])
    red_axes = [i for i, g in enumerate(groups) if g[0] in axes]
    kept = [1 if i in red_axes else s for i, s in enumerate(shape)]
    kept_hint = [1 if i in red_axes else s for i, s in enumerate(shape_hint)]
    tmp = ctx.new_tensor(kept, ctx.tensor_dtype(out), "keepdims", kept_hint)
    ctx.op(code, [flat, ctx.int_const(red_axes, "axes")], [tmp], options("ReducerOptions", keepDims=True))
    ctx.op(BO.RESHAPE, [tmp, ctx.shape_operand(ctx.tensor_dims(out))], [out])


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
