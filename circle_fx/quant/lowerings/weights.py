"""Weight-only int8 layers (``circle.linear_w8``, ``circle.embedding_w8``) in the forms that
onert 0.1.0 computes correctly (measured: ``docs/onert-findings.md``, "int8 weights").

- ``linear_w8`` -> hybrid ``FULLY_CONNECTED`` (float32 input, int8 weight with per-tensor
  scale 1.0, no bias) -> ``MUL`` by the per-row scales ``[O]`` -> ``ADD`` bias -> ``RESHAPE``.
  onert's hybrid FC with per-channel scales silently uses ``scale[0]`` for every row, hence
  the separate MUL; a fused activation goes on the last of these (exact: measured). The
  kernel quantizes each input row to int8 (about 1% relative error);
  the weights stay int8 in memory, which is where the decode speed and RSS gains come from.
  With a dynamic dim the hybrid kernel cannot be used (it crashes when resized), so the weight
  goes through DEQUANTIZE into a float FC instead: exact w.r.t. the int8 weights, same file.
- ``embedding_w8`` -> ``GATHER`` on a uint8 table -> ``DEQUANTIZE`` -> ``MUL`` by the gathered
  row scales. A uint8 table has zero point 128 (``q + 128``). A table that is also an FC weight
  (tied) is int8 in the file; GATHER (which has no int8 kernel) reads it through a uint8 alias
  of the same buffer, so DEQUANTIZE yields ``q mod 256`` and ``q = v - 256 * (v >= 128)``
  restores the sign (GREATER_EQUAL, SUB, SELECT_V2 on the gathered rows only).

- ``conv2d_w8`` -> hybrid ``CONV_2D`` / ``DEPTHWISE_CONV_2D`` (float32 input and output, int8
  filter with **per-channel** scales, float bias), through the float convolution's own lowering
  (:func:`circle_fx.emit.lowerings.conv.convolution`: padding, depthwise, groups, fused
  activation). Unlike its FULLY_CONNECTED, onert's hybrid convolutions apply every channel's
  scale (measured: ``benchmarks/onert_conv_int8.py``), so no MUL follows. The kernel quantizes
  the input map per tensor at run time (about 0.6 % of the output range per convolution).

Kept apart from ``linear.py``: the float linear lowering can pick FULLY_CONNECTED, CONV_2D or
BATCH_MATMUL freely; a quantized weight has exactly one working kernel (hybrid FC).
"""
from __future__ import annotations

import numpy as np
import torch

from ...circle.schema import BO, QuantParams, make_options as options
from ...emit.lowerings._fc import fully_connected, rows_input
from ...emit.lowerings.conv import convolution
from ...fx_utils import arguments
from ...emit.registry import lowering
from ...dialect.weights import conv2d_w8, embedding_w8, linear_w8

_HYBRID = QuantParams(1.0, 0)


def _constant(ctx, value, dtypes, params: QuantParams, what: str) -> int:
    """The constant ``value`` as a tensor carrying ``params``: the encoding is this lowering's
    choice, so the quantize pass's ``QUANT_META`` is used when present and must agree, and a
    graph built by hand (no metadata) gets the same encoding."""
    if value.op != "get_attr" or ctx.dtype(value) not in dtypes:
        raise ctx.error(f"{what} must be a constant of dtype {' or '.join(map(str, dtypes))}, "
                        f"got %{value.name} ({ctx.dtype(value)})")
    given = ctx.quantization(value)
    if given is None:
        return ctx.const_tensor(ctx.constant(value), value.target, params)
    if given != params:
        raise ctx.error(f"{what} %{value.name} carries quantization {given.describe()}; "
                        f"this lowering needs {params.describe()}")
    return ctx.tensor(value)


@lowering(linear_w8)
def lower_linear_w8(ctx, node):
    x, w, scale, bias, activation = arguments(node)
    if ctx.dtype(x) != torch.float32:
        raise ctx.error(f"int8-weight linear needs a float32 input (onert's hybrid FULLY_CONNECTED), "
                        f"got {ctx.dtype(x)}")
    wt = _constant(ctx, w, (torch.int8,), _HYBRID, "the int8 weight")
    out_dims = ctx.dims(node)
    if out_dims[:-1].count(-1) > 1:
        raise ctx.error(f"int8-weight linear with several dynamic leading dims {out_dims} is not supported "
                        "(FULLY_CONNECTED flattens them and RESHAPE can restore only one)")
    xt = rows_input(ctx, x)
    if -1 in out_dims:
        # onert 0.1.0's hybrid FC sizes its scratch buffers at the first run: a later call with
        # more or fewer rows crashes (double free). A dynamic model dequantizes the weight to
        # float on every call instead (same file size and numbers, no hybrid speed/RSS gain).
        wf = ctx.new_tensor(ctx.dims(w, static=True), torch.float32, "weight_f32")
        ctx.op(BO.DEQUANTIZE, [wt], [wf])
        wt = wf
    after = [(BO.MUL, ctx.tensor(scale), options("MulOptions"), "scaled")]
    if bias is not None:
        after.append((BO.ADD, ctx.tensor(bias), options("AddOptions"), "biased"))
    fully_connected(ctx, node, xt, wt, after=after, name="fc_int8", dtype=torch.float32, activation=activation)


@lowering(embedding_w8)
def lower_embedding_w8(ctx, node):
    table, scale, zero_point, ids = node.args
    signed = ctx.dtype(table) == torch.int8
    if signed and zero_point != 0:
        raise ctx.error(f"an int8 table has zero point 0, got {zero_point}")
    tt = _constant(ctx, table, (torch.uint8, torch.int8), QuantParams(1.0, zero_point), "the embedding table")
    params = QuantParams(1.0, zero_point)
    if signed:  # tied with a linear: read the same bytes as uint8, fix the sign below
        tt = ctx.alias(tt, torch.uint8, "table_u8", params)
    rows = ctx.like(node, "rows_u8", torch.uint8, params)
    idx = ctx.tensor(ids)
    ctx.op(BO.GATHER, [tt, idx], [rows], options("GatherOptions", axis=0, batchDims=0))
    values = ctx.like(node, "rows")
    ctx.op(BO.DEQUANTIZE, [rows], [values])
    if signed:
        values = _signed(ctx, node, values)
    ids_dims, ids_hint = ctx.dims(ids), ctx.shape_hint(ids)
    picked = ctx.new_tensor(ids_dims, torch.float32, "row_scale", ids_hint)
    ctx.op(BO.GATHER, [ctx.tensor(scale), idx], [picked], options("GatherOptions", axis=0, batchDims=0))
    column = ctx.new_tensor(ids_dims + [1], torch.float32, "row_scale_col", ids_hint + [1])
    ctx.op(BO.RESHAPE, [picked, ctx.shape_operand(ids_dims + [1])], [column])
    ctx.op(BO.MUL, [values, column], [ctx.output(node)], options("MulOptions"))


def _signed(ctx, node, values):
    """``v`` in [0, 255] (an int8 byte read as uint8) -> the int8 value ``v - 256 * (v >= 128)``."""
    high = ctx.like(node, "negative", torch.bool)
    ctx.op(BO.GREATER_EQUAL, [values, ctx.const(np.array(128, np.float32), "c128")], [high])
    shifted = ctx.like(node, "shifted")
    ctx.op(BO.SUB, [values, ctx.const(np.array(256, np.float32), "c256")], [shifted], options("SubOptions"))
    signed = ctx.like(node, "signed")
    ctx.op(BO.SELECT_V2, [high, shifted, values], [signed])
    return signed


@lowering(conv2d_w8)
def lower_conv2d_w8(ctx, node):
    x, w, scale, b, stride, pads, dilation, groups, activation = arguments(node)
    if ctx.dtype(x) != torch.float32:
        raise ctx.error(f"int8-weight convolution needs a float32 input (onert's hybrid CONV_2D), got {ctx.dtype(x)}")
    weight, scales = ctx.constant(w), ctx.constant(scale)
    if weight is None or weight.dtype != torch.int8 or scales is None:
        raise ctx.error(f"the weight %{w.name} and scale %{scale.name} of an int8-weight convolution must be "
                        "constants (int8 weight)")
    bias = None
    if b is not None:
        bias = ctx.constant(b)
        if bias is None:
            raise ctx.error(f"the bias %{b.name} of a convolution must be a constant")
        bias = bias.detach().to(torch.float32)
    convolution(ctx, node, x, weight, bias, stride, pads, dilation, groups, activation, w.target,
                scale=scales.detach().to(torch.float32))
