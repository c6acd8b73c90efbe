"""Weight-only int8 layers (``circle.linear_w8``, ``circle.embedding_w8``) in the forms that
onert 0.1.0 computes correctly (measured: ``docs/onert-findings.md``, "int8 weights").

- ``linear_w8`` -> hybrid ``FULLY_CONNECTED`` (float32 input, int8 weight with per-tensor
  scale 1.0, no bias) -> ``MUL`` by the per-row scales ``[O]`` -> ``ADD`` bias -> ``RESHAPE``.
  onert's hybrid FC with per-channel scales silently uses ``scale[0]`` for every row, hence
  the separate MUL. The kernel quantizes each input row to int8 (about 1% relative error);
  the weights stay int8 in memory, which is where the decode speed and RSS gains come from.
  With a dynamic dim the hybrid kernel cannot be used (it crashes when resized), so the weight
  goes through DEQUANTIZE into a float FC instead: exact w.r.t. the int8 weights, same file.
- ``embedding_w8`` -> ``GATHER`` on a uint8 table -> ``DEQUANTIZE`` -> ``MUL`` by the gathered
  row scales. A uint8 table has zero point 128 (``q + 128``). A table that is also an FC weight
  (tied) is int8 in the file; GATHER (which has no int8 kernel) reads it through a uint8 alias
  of the same buffer, so DEQUANTIZE yields ``q mod 256`` and ``q = v - 256 * (v >= 128)``
  restores the sign (GREATER_EQUAL, SUB, SELECT_V2 on the gathered rows only).

Kept apart from ``linear.py``: the float linear lowering can pick FULLY_CONNECTED, CONV_2D or
BATCH_MATMUL freely; a quantized weight has exactly one working kernel (hybrid FC).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...circle.schema import QuantParams
from ...quant.ops import embedding_w8, linear_w8
from ..context import quantization_of
from ..registry import lowering
from ._common import BO, options

_HYBRID = QuantParams(1.0, 0)


@lowering(linear_w8)
def lower_linear_w8(ctx, node):
    x, w, scale, bias = node.args
    if ctx.dtype(x) != torch.float32:
        raise ctx.error(f"int8-weight linear needs a float32 input (onert's hybrid FULLY_CONNECTED), "
                        f"got {ctx.dtype(x)}")
    if w.op != "get_attr" or ctx.dtype(w) != torch.int8 or quantization_of(w) != _HYBRID:
        raise ctx.error("int8-weight linear needs a constant int8 weight with per-tensor scale 1.0 and "
                        "zero point 0 (set by the quantize_weights pass)")
    out_shape, out_sig = ctx.shape_of(node)
    if out_sig is not None and out_sig[:-1].count(-1) > 1:
        raise ctx.error(f"int8-weight linear with several dynamic leading dims {out_sig} is not supported "
                        "(FULLY_CONNECTED flattens them and RESHAPE can restore only one)")
    rows = math.prod(out_shape[:-1])
    rows_sig = -1 if out_sig is not None and -1 in out_sig[:-1] else rows
    flat, flat_sig = [rows, out_shape[-1]], ([rows_sig, out_shape[-1]] if out_sig is not None else None)
    xt = ctx.tensor(x)
    if ctx.rank(x) == 1:  # FULLY_CONNECTED needs a 2-D input
        xs, xsig = ctx.shape_of(x)
        sig2 = [1] + xsig if xsig is not None else None
        x2 = ctx.new_tensor([1] + xs, torch.float32, "in2d", sig2)
        ctx.op(BO.RESHAPE, [xt, ctx.shape_operand(shape=[1] + xs, signature=sig2)], [x2])
        xt = x2
    last = len(out_shape) == 2

    def step(name, is_last):
        return ctx.output(node) if is_last and last else ctx.new_tensor(flat, torch.float32, name, flat_sig)

    wt = ctx.tensor(w)
    if out_sig is not None:
        # onert 0.1.0's hybrid FC sizes its scratch buffers at the first run: a later call with
        # more or fewer rows crashes (double free). A dynamic model dequantizes the weight to
        # float on every call instead (same file size and numbers, no hybrid speed/RSS gain).
        wf = ctx.new_tensor(ctx.static_shape(w), torch.float32, "weight_f32")
        ctx.op(BO.DEQUANTIZE, [wt], [wf])
        wt = wf
    fc = ctx.new_tensor(flat, torch.float32, "fc_int8", flat_sig)
    ctx.op(BO.FULLY_CONNECTED, [xt, wt, -1], [fc], options("FullyConnectedOptions", keepNumDims=False))
    scaled = step("scaled", bias is None)
    ctx.op(BO.MUL, [fc, ctx.tensor(scale)], [scaled], options("MulOptions"))
    if bias is not None:
        biased = step("biased", True)
        ctx.op(BO.ADD, [scaled, ctx.tensor(bias)], [biased], options("AddOptions"))
        scaled = biased
    if not last:
        ctx.op(BO.RESHAPE, [scaled, ctx.shape_operand(node)], [ctx.output(node)])


@lowering(embedding_w8)
def lower_embedding_w8(ctx, node):
    table, scale, zero_point, ids = node.args
    dt = ctx.dtype(table)
    q = quantization_of(table)
    if table.op != "get_attr" or dt not in (torch.uint8, torch.int8) or q is None or q.per_channel \
            or q.scale[0] != 1.0 or q.zero_point[0] != zero_point:
        raise ctx.error("int8-weight embedding needs a constant uint8/int8 table with per-tensor scale 1.0 "
                        "and the op's zero point (set by the quantize_weights pass)")
    tt = ctx.tensor(table)
    params = QuantParams(1.0, zero_point)
    if dt == torch.int8:  # tied with a linear: read the same bytes as uint8, fix the sign below
        params = QuantParams(1.0, 0)
        tt = ctx.alias(tt, torch.uint8, "table_u8", params)
    rows = ctx.like(node, "rows_u8", torch.uint8, params)
    idx = ctx.tensor(ids)
    ctx.op(BO.GATHER, [tt, idx], [rows], options("GatherOptions", axis=0, batchDims=0))
    values = ctx.like(node, "rows")
    ctx.op(BO.DEQUANTIZE, [rows], [values])
    if dt == torch.int8:
        values = _signed(ctx, node, values)
    ids_shape, ids_sig = ctx.shape_of(ids)
    col, col_sig = ids_shape + [1], (ids_sig + [1] if ids_sig is not None else None)
    picked = ctx.new_tensor(ids_shape, torch.float32, "row_scale", ids_sig)
    ctx.op(BO.GATHER, [ctx.tensor(scale), idx], [picked], options("GatherOptions", axis=0, batchDims=0))
    column = ctx.new_tensor(col, torch.float32, "row_scale_col", col_sig)
    ctx.op(BO.RESHAPE, [picked, ctx.shape_operand(shape=col, signature=col_sig)], [column])
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
