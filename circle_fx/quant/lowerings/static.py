"""Lowerings of statically quantized graphs: QUANTIZE / DEQUANTIZE and the integer kernels.

Registered when circle_fx is imported, like every other lowering. The ``quantized_decomposed``
ops that PT2E's ``convert_pt2e`` produces are defined by
``torch.ao.quantization.fx._decomposed`` (part of torch, quiet and cheap to import; torchao
uses the same ops), so they exist without torchao. These lowerings are not in the
one-op-in-onert table (``tests/lowerings/test_every_lowering.py``, float inputs): uint8 model
inputs break onert's ``infer()``, so they are exercised end to end through PT2E-quantized
models instead (``tests/quant/test_pt2e_*.py``). They use only the ``LoweringContext`` seam,
like the built-ins.

Every integer tensor carries its :class:`~circle_fx.circle.schema.QuantParams` (the Q/DQ
pass puts them in the node's quantization slot and ``ctx.output`` writes them), so a
lowering only adds what no node holds: the int32 bias of FULLY_CONNECTED (scale
``s_x * s_w``, zero point 0) and the parameters of the tensors RESHAPE introduces.
"""
from __future__ import annotations

import numpy as np
import torch

import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines torch.ops.quantized_decomposed.*)

from ...circle.schema import BO, QuantParams, default_options, make_options as options
from ...emit.lowerings._fc import fully_connected, rows_input
from ...emit.lowerings.conv import convolution
from ...emit.registry import lowering
from ...fx_utils import arguments
from ...dialect import quantized as qops

_QD = torch.ops.quantized_decomposed


@lowering(_QD.quantize_per_tensor.default)
def quantize(ctx, node):
    ctx.op(BO.QUANTIZE, [ctx.tensor(node.args[0])], [ctx.output(node)], default_options(BO.QUANTIZE))


@lowering(_QD.dequantize_per_tensor.default)
def dequantize(ctx, node):
    src = node.args[0]
    if ctx.quantization(src) is None:
        raise ctx.error(f"dequantizes %{src.name}, which carries no quantization parameters "
                        "(run the Q/DQ passes: circle_fx.export does when the graph has Q/DQ nodes)")
    ctx.op(BO.DEQUANTIZE, [ctx.tensor(src)], [ctx.output(node)], default_options(BO.DEQUANTIZE))


@lowering(qops.q_linear)
def q_linear(ctx, node):
    """uint8 x uint8 -> uint8 FULLY_CONNECTED, int32 bias (int16 x int8 -> int16: int64
    bias, as TFLite's 16x8 kernels); N-D input as for float linear. A fused ReLU / ReLU6
    (``onert`` target, a ``circle.linear_act``) is the FC's own activation: onert clamps the
    uint8 result exactly (``benchmarks/onert_fc_activation.py``)."""
    x, xs, _, w, ws, _, b, _, _, activation = arguments(node)
    _fc(ctx, node, x, xs, w, (ws,), b, activation)


@lowering(qops.q_linear_pc)
def q_linear_pc(ctx, node):
    """As ``q_linear`` with a weight quantized per output row (``npu`` target); the bias
    gets one scale per row too (``s_x * s_w[i]``)."""
    x, xs, _, w, w_scales, _, b = node.args[:7]
    _fc(ctx, node, x, xs, w, tuple(ctx.constant(w_scales).tolist()), b)


def _fc(ctx, node, x, xs, w, w_scales: tuple, b, activation="none"):
    for v in (x, node):  # static shapes only: raises on a dynamic dim
        ctx.dims(v, static=True)
    bias = -1
    if b is not None:
        ints, qp = int_bias(ctx, b, xs, w_scales, torch.int64 if ctx.dtype(x) == torch.int16 else torch.int32)
        bias = ctx.const(ints.numpy(), "bias_q", quantization=qp)
    fully_connected(ctx, node, rows_input(ctx, x), ctx.tensor(w), bias, quantization=ctx.quantization(node),
                    activation=activation)


def int_bias(ctx, b, xs, w_scales: tuple, dtype=torch.int32) -> tuple[torch.Tensor | None, QuantParams]:
    """The float bias constant ``b`` as the integers an integer FULLY_CONNECTED / CONV_2D adds to
    its accumulator (None when ``b`` is None), and their parameters: scale ``s_x * s_w`` (one per
    weight scale), zero point 0. The scales are the float32 ones the file holds, multiplied in
    float64. ``dtype``: int32, int64 under int16 activations (TFLite's 16x8 kernels)."""
    scales = np.float32(xs).astype(np.float64) * np.asarray(w_scales, np.float32).astype(np.float64)
    qp = QuantParams(tuple(scales.tolist()), (0,) * len(scales))
    if b is None:
        return None, qp
    return torch.round(ctx.constant(b).detach().double() / torch.from_numpy(scales)).to(dtype), qp


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
    """One RMS_NORM on integer tensors (``npu`` target); gamma is a quantized constant. Any
    rank: the ``ranks`` legalization step folds it into the ranks onert's kernel takes."""
    x, w, eps = node.args[0], node.args[3], node.args[6]
    ctx.dims(x, static=True)  # static shapes only
    ctx.op(BO.RMS_NORM, [ctx.tensor(x), ctx.tensor(w)], [ctx.output(node)],
           options("RmsNormOptions", epsilon=float(eps)))


@lowering(qops.q_conv2d)
def q_conv2d(ctx, node):
    """uint8 x uint8 -> uint8 CONV_2D / DEPTHWISE_CONV_2D (per-tensor weight, int32 bias at
    ``s_x * s_w``; what onert 0.1.0 computes right: ``benchmarks/onert_conv_int8.py``; an int8
    weight under uint8 activations is silently wrong there), through the float convolution's
    lowering (padding as PADV2 with the input's zero point, groups, fused activation)."""
    x, xs, _, w, ws, wzp, b, stride, pads, dilation, groups, activation = node.args[:12]
    weight = ctx.constant(w)
    if ctx.dtype(x) != torch.uint8 or weight is None or weight.dtype != torch.uint8:
        raise ctx.error(f"a quantized convolution is lowered for uint8 input and weight only (what onert 0.1.0 "
                        f"computes right), not {ctx.dtype(x)} x {None if weight is None else weight.dtype}: "
                        "quantize convolutions with uint8 activations (quant_target='onert')")
    bias, bias_quant = int_bias(ctx, b, xs, (ws,))
    convolution(ctx, node, x, weight.detach(), bias, stride, pads, dilation, groups, activation, w.target,
                quant=QuantParams((ws,), (wzp,)), bias_quant=bias_quant)
