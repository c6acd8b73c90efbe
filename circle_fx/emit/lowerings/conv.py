"""Channels-last convolutions and pools (``circle.*_nhwc``) -> CONV_2D, DEPTHWISE_CONV_2D,
MAX_POOL_2D, AVERAGE_POOL_2D.

Padding: Circle has only SAME and VALID. Each spatial dim's explicit ``[before, after]``
padding (``dialect.nhwc``) is compared with what SAME would pad; when they agree the op uses SAME,
otherwise a PAD (zeros; ``-inf`` for max pools, which never wins a max) in front and VALID.
Rows that torch pads but no window reads are not padded.

Weights are torch's ``[out, in/groups, kH, kW]`` constants, reordered once at compile time:
``groups == 1`` -> CONV_2D filter ``[out, kH, kW, in]``; one group per input channel
(depthwise, any channel multiplier) -> DEPTHWISE_CONV_2D filter ``[1, kH, kW, out]``; other
group counts -> a SPLIT along channels, one CONV_2D per group, a CONCATENATION. onert needs
the bias slot filled, so a conv without bias gets zeros.

Average pools: AVERAGE_POOL_2D divides by the window area; torch divides by the cells it
counts (``count_include_pad``, ``ceil_mode`` windows, ``divisor_override``). The ratio per
output cell depends only on shapes, so it is computed here with torch and applied as one
MUL by a constant ``[1, Ho, Wo, 1]`` map when it is not all ones (SAME is used when it is
exactly torch's divisor).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from ...fx_utils import arguments
from ...dialect.nhwc import avg_pool2d_nhwc, conv2d_nhwc, max_pool2d_nhwc
from ..registry import lowering
from ...circle.schema import QuantParams
from ._common import ACTIVATION as _ACTIVATION, BO, options

SAME, VALID = 0, 1  # circle.Padding.Padding


def _spatial(ctx, node, x) -> tuple[list[int], list[int]]:
    """Static ``[H, W]`` of the input and of the result (NHWC)."""
    in_dims, out_dims = ctx.dims(x), ctx.dims(node)
    if -1 in in_dims[1:] or -1 in out_dims[1:]:
        raise ctx.error(f"dynamic spatial or channel dims ({in_dims} -> {out_dims}) are not supported")
    return in_dims[1:3], out_dims[1:3]


def _plan(sizes, outs, kernel, stride, dilation, pads):
    """(SAME or VALID, the ``[[before, after]] * 2`` rows a VALID window needs padded, or None
    when it needs none) for these windows."""
    needed, same = [], True
    for i in range(2):
        k = dilation[i] * (kernel[i] - 1) + 1
        before = pads[2 * i]
        after = (outs[i] - 1) * stride[i] + k - sizes[i] - before  # < 0: trailing rows no window reads
        needed.append([before, max(after, 0)])
        out_same = -(-sizes[i] // stride[i])
        total = max((out_same - 1) * stride[i] + k - sizes[i], 0)
        same &= outs[i] == out_same and [before, max(after, 0)] == [total // 2, total - total // 2]
    if not any(sum(p) for p in needed):
        return VALID, None
    return (SAME if same else VALID), needed


def _padded(ctx, x, dtype, pads, value=None) -> int:
    """``x`` (NHWC) with ``pads`` ``[[top, bottom], [left, right]]`` added: PAD, or PADV2 for ``value``."""
    dims = ctx.dims(x)
    table = np.array([[0, 0], *pads, [0, 0]], dtype=np.int32)
    out_dims = [d if d == -1 else d + sum(p) for d, p in zip(dims, table.tolist())]
    quant = ctx.quantization(x)
    out = ctx.new_tensor(out_dims, dtype, "padded", [h + sum(p) for h, p in zip(ctx.shape_hint(x), table.tolist())],
                         quant)
    inputs = [ctx.tensor(x), ctx.const(table, "paddings")]
    if value is None:
        ctx.op(BO.PAD, inputs, [out])
    else:  # a float value (-inf), or an integer tensor's zero point (with its quantization)
        arr = value if isinstance(value, np.ndarray) else np.array(value, dtype=np.float32)
        inputs.append(ctx.const(arr, "pad_value", quantization=quant if arr.dtype != np.float32 else None))
        ctx.op(BO.PADV2, inputs, [out])
    return out


def _input(ctx, node, x, plan, value=None) -> tuple[int, int]:
    """(Circle padding, input tensor): SAME on ``x``, or VALID on ``x`` padded as needed."""
    padding, pads = plan
    if padding == SAME or pads is None:
        return padding, ctx.tensor(x)
    return padding, _padded(ctx, x, ctx.dtype(node), pads, value)


@lowering(conv2d_nhwc)
def conv2d(ctx, node):
    x, w, b, stride, pads, dilation, groups, activation = arguments(node)
    weight = ctx.constant(w)
    if weight is None:
        raise ctx.error(f"the weight %{w.name} of a convolution must be a constant (a parameter or buffer)")
    if b is not None and ctx.constant(b) is None:
        raise ctx.error(f"the bias %{b.name} of a convolution must be a constant")
    bias = ctx.constant(b).detach() if b is not None else None
    convolution(ctx, node, x, weight.detach(), bias, stride, pads, dilation, groups, activation, w.target)


def convolution(ctx, node, x, weight, bias, stride, pads, dilation, groups, activation, name, scale=None,
                quant=None, bias_quant=None):
    """The Circle operators of one NHWC convolution of ``x`` with the constant ``weight`` (torch's
    ``[out, in/groups, kH, kW]``) and ``bias`` (None: zeros). ``scale`` (``[out]``): ``weight`` is
    int8 with one scale per output channel, written as the filter's per-channel quantization
    (axis 0 of CONV_2D's OHWI filter, 3 of DEPTHWISE_CONV_2D's ``[1, kH, kW, out]``): onert's
    hybrid kernels (float input and output) — the weight-only int8 lowering shares this one.
    ``quant`` / ``bias_quant``: per-tensor parameters of an integer ``weight`` and ``bias`` (the
    fully quantized convolution); ``x`` then carries its own, and a padded copy of it too
    (padded with its zero point: the real value 0)."""
    sizes, outs = _spatial(ctx, node, x)
    value = None if quant is None else np.array(ctx.quantization(x).zero_point[0], np.uint8)
    padding, xt = _input(ctx, node, x, _plan(sizes, outs, weight.shape[2:], stride, dilation, pads), value)
    c_in, c_out = ctx.dims(x)[3], weight.shape[0]
    if bias is None:
        bias = torch.zeros(c_out, dtype=torch.float32 if quant is None else torch.int32)
    common = dict(padding=padding, strideH=stride[0], strideW=stride[1], dilationHFactor=dilation[0],
                  dilationWFactor=dilation[1], fusedActivationFunction=_ACTIVATION[activation])
    filt_q = lambda part, axis: quant if quant is not None else _per_channel(part, axis)  # noqa: E731
    if groups == 1:
        _conv(ctx, xt, weight, bias, ctx.output(node), common, filt_q(scale, 0), bias_quant)
    elif groups == c_in and c_out % c_in == 0:
        filt = weight.reshape(c_out, *weight.shape[2:]).permute(1, 2, 0).unsqueeze(0).contiguous()
        ctx.op(BO.DEPTHWISE_CONV_2D, [xt, ctx.const_tensor(filt, f"{name}_dw", filt_q(scale, 3)),
                                      ctx.const(bias.numpy(), "bias", quantization=bias_quant)],
               [ctx.output(node)], options("DepthwiseConv2DOptions", depthMultiplier=c_out // c_in, **common))
    else:
        _grouped(ctx, node, xt, weight, bias, groups, common, scale, quant, bias_quant)


def _per_channel(scale, axis):
    """The filter's symmetric per-channel int8 quantization along ``axis``; None for a float filter."""
    if scale is None:
        return None
    return QuantParams(scale.numpy(), np.zeros(scale.numel(), np.int64), axis)


def _conv(ctx, xt, weight, bias, out, common, filter_quant=None, bias_quant=None):
    filt = weight.permute(0, 2, 3, 1).contiguous()  # OHWI
    ctx.op(BO.CONV_2D, [xt, ctx.const_tensor(filt, "filter", filter_quant),
                        ctx.const(bias.numpy(), "bias", quantization=bias_quant)],
           [out], options("Conv2DOptions", **common))


def _grouped(ctx, node, xt, weight, bias, groups, common, scale=None, quant=None, bias_quant=None):
    """A SPLIT of the (padded) input along channels, one CONV_2D per group, CONCATENATION."""
    in_dims = ctx.tensor_dims(xt)
    out_dims, hint = ctx.dims(node), ctx.shape_hint(node)
    xq, oq = ctx.quantization(node.args[0]), ctx.quantization(node)
    piece_in = in_dims[:3] + [in_dims[3] // groups]
    pieces = [ctx.new_tensor(piece_in, ctx.dtype(node), f"group{g}_in", ctx.tensor_hint(xt)[:3] + [piece_in[3]], xq)
              for g in range(groups)]
    ctx.op(BO.SPLIT, [ctx.int_const(3, "axis"), xt], pieces, options("SplitOptions", numSplits=groups))
    co = weight.shape[0] // groups
    results = []
    for g in range(groups):
        y = ctx.new_tensor(out_dims[:3] + [co], ctx.dtype(node), f"group{g}", hint[:3] + [co], oq)
        part = slice(g * co, (g + 1) * co)
        fq = quant if quant is not None else _per_channel(None if scale is None else scale[part], 0)
        _conv(ctx, pieces[g], weight[part], bias[part], y, common, fq, bias_quant)
        results.append(y)
    ctx.op(BO.CONCATENATION, results, [ctx.output(node)], options("ConcatenationOptions", axis=3))


def _pool_options(padding, kernel, stride):
    return options("Pool2DOptions", padding=padding, strideH=stride[0], strideW=stride[1],
                   filterHeight=kernel[0], filterWidth=kernel[1])


@lowering(max_pool2d_nhwc)
def max_pool2d(ctx, node):
    x, kernel, stride, pads = arguments(node)
    sizes, outs = _spatial(ctx, node, x)
    padding, xt = _input(ctx, node, x, _plan(sizes, outs, kernel, stride, [1, 1], pads), float("-inf"))
    ctx.op(BO.MAX_POOL_2D, [xt], [ctx.output(node)], _pool_options(padding, kernel, stride))


@lowering(avg_pool2d_nhwc)
def avg_pool2d(ctx, node):
    x, kernel, stride, pads, ceil_mode, count_include_pad, divisor_override = arguments(node)
    sizes, outs = _spatial(ctx, node, x)
    # torch's result over Circle's VALID pool of the zero-padded input, per output cell
    ones = torch.ones(1, 1, *sizes, dtype=torch.float64)
    torch_avg = F.avg_pool2d(ones, kernel, stride, [pads[0], pads[2]], ceil_mode, count_include_pad, divisor_override)
    plan = _plan(sizes, outs, kernel, stride, [1, 1], pads)
    if plan[0] == SAME and torch.allclose(torch_avg, torch.ones_like(torch_avg)):
        # torch divides by the cells inside the input, as SAME does
        ctx.op(BO.AVERAGE_POOL_2D, [ctx.tensor(x)], [ctx.output(node)], _pool_options(SAME, kernel, stride))
        return
    pad_table = plan[1] or [[0, 0], [0, 0]]
    area = kernel[0] * kernel[1]
    inside = F.avg_pool2d(F.pad(ones, (*pad_table[1], *pad_table[0])), kernel, stride) * area
    factor = torch.where(inside > 0, area * torch_avg / inside.clamp(min=1), torch.ones_like(inside))
    xt = ctx.tensor(x) if plan[1] is None else _padded(ctx, x, ctx.dtype(node), plan[1])
    if torch.allclose(factor, torch.ones_like(factor), rtol=0, atol=1e-12):
        ctx.op(BO.AVERAGE_POOL_2D, [xt], [ctx.output(node)], _pool_options(VALID, kernel, stride))
        return
    pooled = ctx.like(node, "pool")
    ctx.op(BO.AVERAGE_POOL_2D, [xt], [pooled], _pool_options(VALID, kernel, stride))
    scale = factor.reshape(1, outs[0], outs[1], 1).to(torch.float32).numpy()
    ctx.op(BO.MUL, [pooled, ctx.const(scale, "divisor_fix")], [ctx.output(node)], options("MulOptions"))
