"""The FULLY_CONNECTED chain both quantized linear lowerings end in (int8 weights and GGML
blocks): FC on ``[rows, in]`` rows, then each of the lowering's follow-up operators (MUL by
row scales, ADD bias) on ``[rows, out]``, the last writing the node's output, RESHAPEd back
to its leading dims when it has more than two. One helper, so the two lowerings differ only
in what they choose: the weight's encoding and the operators after the FC.
"""
from __future__ import annotations

import torch

from ...circle.schema import BO, make_options as options


def fully_connected(ctx, node, xt: int, wt: int, after: list[tuple[int, int, object, str]],
                    flat: list[int], flat_hint: list[int] | None = None, name: str = "fc") -> None:
    """FC of input tensor ``xt`` (2-D, or leading dims the FC flattens) by weight ``wt`` (no
    bias operand), then ``after``: ``(code, operand, options, name)`` applied in turn as
    ``code(previous, operand)``. ``flat``: the ``[rows, out]`` dims (-1 dynamic, ``flat_hint``
    its example sizes)."""
    last = len(ctx.dims(node)) == 2
    steps = [(BO.FULLY_CONNECTED, -1, options("FullyConnectedOptions", keepNumDims=False), name), *after]
    cur = xt
    for k, (code, operand, opts, step_name) in enumerate(steps):
        out = ctx.output(node) if last and k == len(steps) - 1 else \
            ctx.new_tensor(flat, torch.float32, step_name, flat_hint)
        ctx.op(code, [cur, wt, -1] if k == 0 else [cur, operand], [out], opts)
        cur = out
    if not last:
        ctx.op(BO.RESHAPE, [cur, ctx.shape_operand(node)], [ctx.output(node)])
