"""``circle.rope(x, sin, cos)`` -> Circle ROPE (builtin -7), mode GPT_NEOX.

onert wants 4-D tables whose last dim is the head dim, in the input order (x, sin, cos),
and a RoPEOptions table (without it the kernel segfaults). The fusion only creates this
op for single-position tables (see circle_fx/fusions/rope.py), so reshaping them to
[1, 1, 1, D] is exact.
"""
from __future__ import annotations

from ...fusions.rope import rope
from ..registry import lowering
from ._common import BO, operand, options

GPT_NEOX = 0


@lowering(rope)
def lower_rope(ctx, node):
    x, sin, cos = node.args
    dt = ctx.dtype(x)
    d = ctx.static_shape(x)[-1]
    tables = []
    for name, t in (("sin", sin), ("cos", cos)):
        idx = operand(ctx, t, dt)
        if ctx.static_shape(t) != [1, 1, 1, d]:
            r = ctx.new_tensor([1, 1, 1, d], dt, f"{name}4d")
            ctx.op(BO.RESHAPE, [idx, ctx.int_const([1, 1, 1, d])], [r])
            idx = r
        tables.append(idx)
    ctx.op(BO.ROPE, [ctx.tensor(x), *tables], [ctx.output(node)], options("RoPEOptions", mode=GPT_NEOX))
