"""``clamp`` / ``clamp_min`` / ``clamp_max`` as MAXIMUM then MINIMUM.

A missing bound (``None``) emits no operator for that side, so GPT-OSS's
``gate.clamp(max=limit)`` is a single MINIMUM.
"""
from __future__ import annotations

import torch

from ...fx_utils import arguments
from ..registry import lowering
from ._common import BO, operand

aten = torch.ops.aten


@lowering(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_max.default)
def clamp(ctx, node):
    args = arguments(node)
    if node.target is aten.clamp_min.default:
        lo, hi = args[1], None
    elif node.target is aten.clamp_max.default:
        lo, hi = None, args[1]
    else:
        lo, hi = args[1], args[2]
    dt = ctx.dtype(node)
    x = operand(ctx, args[0], dt)
    steps = [(code, bound) for code, bound in ((BO.MAXIMUM, lo), (BO.MINIMUM, hi)) if bound is not None]
    if not steps:  # clamp(x) with no bounds is the identity
        ctx.op(BO.RESHAPE, [x, ctx.shape_operand(node)], [ctx.output(node)])
        return
    for i, (code, bound) in enumerate(steps):
        out = ctx.output(node) if i == len(steps) - 1 else ctx.like(node, "clamp_lo")
        ctx.op(code, [x, operand(ctx, bound, dt)], [out])
        x = out
