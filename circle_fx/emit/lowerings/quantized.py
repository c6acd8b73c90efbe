"""Quantized ops -> Circle: QUANTIZE / DEQUANTIZE and the integer kernels.

Registered lazily by :func:`register` (called when a graph holds ``quantized_decomposed``
nodes): those ops exist only once torchao (or torch's quantization package) is imported.
Every integer tensor carries its :class:`~circle_fx.circle.schema.QuantParams` — the Q/DQ
pass puts them in ``node.meta[QUANT_META]`` and ``ctx.output`` writes them — so a
lowering only adds what no node holds: the int32 bias of FULLY_CONNECTED (scale
``s_x * s_w``, zero point 0) and the parameters of the tensors RESHAPE introduces.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...circle.schema import QuantParams, default_options
from ...emit.context import quantization_of
from ...program import fetch_attr
from ...quant import qops
from ..registry import LOWERINGS, lowering
from ._common import BO, options


def register() -> None:
    """Register QUANTIZE/DEQUANTIZE for ``quantized_decomposed`` (idempotent)."""
    ns = torch.ops.quantized_decomposed
    LOWERINGS[ns.quantize_per_tensor.default] = quantize
    LOWERINGS[ns.dequantize_per_tensor.default] = dequantize


def quantize(ctx, node):
    ctx.op(BO.QUANTIZE, [ctx.tensor(node.args[0])], [ctx.output(node)], default_options(BO.QUANTIZE))


def dequantize(ctx, node):
    src = node.args[0]
    if quantization_of(src) is None:
        raise ctx.error(f"dequantizes %{src.name}, which carries no quantization parameters "
                        "(run the Q/DQ passes: circle_fx.export does when the graph has Q/DQ nodes)")
    ctx.op(BO.DEQUANTIZE, [ctx.tensor(src)], [ctx.output(node)], default_options(BO.DEQUANTIZE))


def _reshaped(ctx, idx, shape, quant, name):
    """``idx`` reshaped to ``shape`` (a new tensor with the same quantization)."""
    out = ctx.new_tensor(shape, ctx.dtype(ctx.node), name, quantization=quant)
    ctx.op(BO.RESHAPE, [idx, ctx.int_const(shape)], [out])
    return out


@lowering(qops.q_linear)
def q_linear(ctx, node):
    """uint8 x uint8 -> uint8 FULLY_CONNECTED, int32 bias; N-D input as for float linear."""
    x, xs, _, w, ws, _, b = node.args[:7]
    out_shape = ctx.static_shape(node)
    quant = quantization_of(node)
    bias = -1
    if b is not None:
        bq = torch.round(fetch_attr(ctx.program.gm, b.target).detach().float() / (float(np.float32(xs)) *
                                                                                      float(np.float32(ws))))
        bias = ctx.const(bq.to(torch.int32).numpy(), "bias_q",
                         quantization=QuantParams((float(np.float32(xs)) * float(np.float32(ws)),), (0,)))
    xt = ctx.tensor(x)
    xshape = ctx.static_shape(x)
    if len(xshape) != 2:
        xt = _reshaped(ctx, xt, [math.prod(xshape[:-1]), xshape[-1]], quantization_of(x), "in2d")
    rows = [math.prod(out_shape[:-1]), out_shape[-1]]
    fc_out = ctx.output(node) if len(out_shape) == 2 else ctx.new_tensor(rows, ctx.dtype(node), "fc",
                                                                          quantization=quant)
    ctx.op(BO.FULLY_CONNECTED, [xt, ctx.tensor(w), bias], [fc_out], options("FullyConnectedOptions", keepNumDims=False))
    if len(out_shape) != 2:
        ctx.op(BO.RESHAPE, [fc_out, ctx.int_const(out_shape)], [ctx.output(node)])


@lowering(qops.q_add, qops.q_mul)
def q_binary(ctx, node):
    code, opt = (BO.ADD, "AddOptions") if node.target is qops.q_add else (BO.MUL, "MulOptions")
    a, b = node.args[0], node.args[3]
    ctx.op(code, [ctx.tensor(a), ctx.tensor(b)], [ctx.output(node)], options(opt))


@lowering(qops.q_embedding)
def q_embedding(ctx, node):
    """GATHER of uint8 rows: the output shares the table's quantization (onert: exact)."""
    w, ids = node.args[0], node.args[3]
    ctx.op(BO.GATHER, [ctx.tensor(w), ctx.tensor(ids)], [ctx.output(node)],
           options("GatherOptions", axis=0, batchDims=0))


@lowering(qops.q_rms_norm)
def q_rms_norm(ctx, node):
    """One RMS_NORM on integer tensors (``npu`` target); gamma is a quantized constant."""
    x, w, eps = node.args[0], node.args[3], node.args[6]
    shape = ctx.static_shape(x)
    opts = options("RmsNormOptions", epsilon=float(eps))
    if len(shape) in (3, 4):
        ctx.op(BO.RMS_NORM, [ctx.tensor(x), ctx.tensor(w)], [ctx.output(node)], opts)
        return
    as3d = [1, math.prod(shape[:-1]), shape[-1]]
    x3 = _reshaped(ctx, ctx.tensor(x), as3d, quantization_of(x), "in3d")
    y3 = ctx.new_tensor(as3d, ctx.dtype(node), "out3d", quantization=quantization_of(node))
    ctx.op(BO.RMS_NORM, [x3, ctx.tensor(w)], [y3], opts)
    ctx.op(BO.RESHAPE, [y3, ctx.int_const(shape)], [ctx.output(node)])
