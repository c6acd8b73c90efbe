"""The one way a linear becomes FULLY_CONNECTED, shared by the float linear lowering and the
quantized ones (``quant/lowerings``: PT2E uint8, int8 weights, GGML blocks).

onert's FULLY_CONNECTED takes an input of rank >= 2 (it flattens the leading dims into rows)
and writes ``[rows, out]``: :func:`rows_input` gives a 1-D input its row (the ``ggml_rows``
legalization step flattens the input of a GGML-weight FC, whose kernel aborts on most N-D
inputs: ``emit/legalize/forms.py``); :func:`fully_connected` runs the FC and the lowering's follow-up operators (MUL by
row scales, ADD bias) on ``[rows, out]``, the last writing the node's output, RESHAPEd back to
its leading dims when it has more than two (one dynamic dim becomes -1). The lowerings differ
only in what they choose: the weight's encoding, the bias operand and the operators after.

A fused ``activation`` (``circle.linear_act``, the ``linear_activation`` family) goes on the
last operator of the chain (the FC itself, or the MUL / ADD after it), the one that writes the
linear's result: exact in onert for the float, hybrid int8 and uint8 FC and for MUL / ADD; the
GGML FC ignores it, so its lowering always ends the chain with an ADD
(``benchmarks/onert_fc_activation.py``).
"""
from __future__ import annotations

import math

from ._common import ACTIVATION, BO, options


def rows_input(ctx, x) -> int:
    """Input node ``x``'s tensor as FULLY_CONNECTED takes it: ``[1, in]`` for a 1-D input,
    else as it is."""
    xt, dims, hint = ctx.tensor(x), ctx.dims(x), ctx.shape_hint(x)
    if len(dims) == 1:
        return ctx.reshaped(xt, [1, dims[-1]], [1, hint[-1]], "in2d")
    return xt


def fully_connected(ctx, node, xt: int, wt: int, bias: int = -1, after=(), name: str = "fc",
                    dtype=None, quantization=None, activation: str = "none") -> None:
    """FC of input tensor ``xt`` by weight ``wt`` (``bias``: its bias operand, -1 none), then
    ``after``: ``(code, operand, options, name)`` applied in turn as ``code(previous, operand)``.
    Intermediates are ``[rows, out]`` of ``dtype`` (default: the node's) and ``quantization``.
    ``activation`` (none, relu, relu6) is fused into the last of these operators."""
    out_dims, out_hint = ctx.dims(node), ctx.shape_hint(node)
    rows = math.prod(out_hint[:-1])
    # a dynamic dim anywhere before the last makes the row count dynamic
    flat, flat_hint = [-1 if -1 in out_dims[:-1] else rows, out_dims[-1]], [rows, out_hint[-1]]
    last = len(out_dims) == 2
    steps = [(BO.FULLY_CONNECTED, None, options("FullyConnectedOptions", keepNumDims=False), name), *after]
    if activation != "none":
        if not hasattr(steps[-1][2], "fusedActivationFunction"):
            raise ctx.error(f"the fused {activation} cannot go on the last operator of this chain")
        steps[-1][2].fusedActivationFunction = ACTIVATION[activation]
    cur = xt
    for k, (code, operand, opts, step_name) in enumerate(steps):
        out = ctx.output(node) if last and k == len(steps) - 1 else \
            ctx.new_tensor(flat, dtype or ctx.dtype(node), step_name, flat_hint, quantization)
        ctx.op(code, [cur, wt, bias] if k == 0 else [cur, operand], [out], opts)
        cur = out
    if not last:
        ctx.op(BO.RESHAPE, [cur, ctx.shape_operand(node)], [ctx.output(node)])
