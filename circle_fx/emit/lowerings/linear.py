"""Matrix products: ``linear`` -> FULLY_CONNECTED, ``matmul``/``bmm`` -> BATCH_MATMUL,
``embedding`` -> GATHER.

FULLY_CONNECTED takes torch's ``[out, in]`` weight as is, so weights need no transpose
at compile time or run time. onert's FULLY_CONNECTED returns ``[rows, out]`` whatever
``keep_num_dims`` says and needs a bias slot (-1 when absent), so N-D inputs get a
RESHAPE after it. Weights that are not constants go through BATCH_MATMUL instead.
"""
from __future__ import annotations

import math

import torch

from ...fx_utils import arguments
from ..registry import lowering
from ._common import BO, options

aten = torch.ops.aten


@lowering(aten.linear.default)
def linear(ctx, node):
    x, w, b = (arguments(node) + [None])[:3]
    if w.op != "get_attr":
        _linear_runtime_weight(ctx, node, x, w, b)
        return
    out_dims, out_hint = ctx.dims(node), ctx.shape_hint(node)
    if out_dims[:-1].count(-1) > 1:
        _linear_batch_matmul(ctx, node, x, w, b)
        return
    rows = math.prod(out_hint[:-1])
    # a dynamic dim anywhere before the last makes the row count dynamic
    rows_dim = -1 if -1 in out_dims[:-1] else rows
    bias = ctx.tensor(b) if b is not None else -1
    if len(out_dims) == 2:
        fc_out = ctx.output(node)
    else:
        fc_out = ctx.new_tensor([rows_dim, out_dims[-1]], ctx.dtype(node), "fc", [rows, out_hint[-1]])
    xt = ctx.tensor(x)
    if ctx.rank(x) == 1:  # onert's FULLY_CONNECTED needs a 2-D (or more) input
        dims2 = [1] + ctx.dims(x)
        x2 = ctx.new_tensor(dims2, ctx.dtype(x), "in2d", [1] + ctx.shape_hint(x))
        ctx.op(BO.RESHAPE, [xt, ctx.shape_operand(dims2)], [x2])
        xt = x2
    ctx.op(BO.FULLY_CONNECTED, [xt, ctx.tensor(w), bias], [fc_out],
           options("FullyConnectedOptions", keepNumDims=False))
    if len(out_dims) != 2:
        # FULLY_CONNECTED flattens leading dims; restore them (one dynamic dim becomes -1)
        ctx.op(BO.RESHAPE, [fc_out, ctx.shape_operand(node)], [ctx.output(node)])


def _linear_batch_matmul(ctx, node, x, w, b):
    """Several dynamic leading dims: FULLY_CONNECTED would flatten them and the RESHAPE back
    could infer only one, so multiply by the transposed weight with BATCH_MATMUL instead
    (rank-broadcast ``[..., in] x [in, out]``) and add the bias."""
    weight = ctx.constant(w).detach()
    _matmul_plus_bias(ctx, node, x, ctx.const(weight.t().contiguous().numpy(), "weight_T"), b)


def _linear_runtime_weight(ctx, node, x, w, b):
    wshape = ctx.dims(w, static=True)
    wt = ctx.new_tensor([wshape[1], wshape[0]], ctx.dtype(w), "wT")
    ctx.op(BO.TRANSPOSE, [ctx.tensor(w), ctx.int_const([1, 0], "perm")], [wt])
    _matmul_plus_bias(ctx, node, x, wt, b)


def _matmul_plus_bias(ctx, node, x, wt, b):
    """``x @ wt`` (``wt`` is the ``[in, out]`` weight tensor) with BATCH_MATMUL, then ADD the bias."""
    out = ctx.output(node) if b is None else ctx.like(node, "mm")
    ctx.op(BO.BATCH_MATMUL, [ctx.tensor(x), wt], [out], options("BatchMatMulOptions"))
    if b is not None:
        ctx.op(BO.ADD, [out, ctx.tensor(b)], [ctx.output(node)], options("AddOptions"))


@lowering(aten.matmul.default, aten.bmm.default, aten.mm.default)
def matmul(ctx, node):
    a, b = node.args[0], node.args[1]
    if ctx.rank(a) < 2 or ctx.rank(b) < 2:
        raise ctx.error("matmul with a 1-D operand is not supported")
    ctx.op(BO.BATCH_MATMUL, [ctx.tensor(a), ctx.tensor(b)], [ctx.output(node)], options("BatchMatMulOptions"))


@lowering(aten.embedding.default)
def embedding(ctx, node):
    weight, indices = node.args[0], node.args[1]
    ctx.op(BO.GATHER, [ctx.tensor(weight), ctx.tensor(indices)], [ctx.output(node)],
           options("GatherOptions", axis=0, batchDims=0))


@lowering(aten.index_select.default)
def index_select(ctx, node):
    x, dim, index = node.args
    dim = dim % ctx.rank(x)
    ctx.op(BO.GATHER, [ctx.tensor(x), ctx.tensor(index)], [ctx.output(node)],
           options("GatherOptions", axis=dim, batchDims=0))
