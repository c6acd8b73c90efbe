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
    d = ctx.dims(x, static=True)[-1]
    tables = []
    for name, t in (("sin", sin), ("cos", cos)):
        dims = ctx.dims(t, static=True)
        if dims[-1] != d or any(k != 1 for k in dims[:-1]):
            raise ctx.error(f"{name} table {dims}: onert's ROPE is exact only for one position "
                            f"([..., {d}] with every other dim 1); it would apply row 0 to every position")
        idx = operand(ctx, t, dt)
        if ctx.dims(t, static=True) != [1, 1, 1, d]:
            r = ctx.new_tensor([1, 1, 1, d], dt, f"{name}4d")
            ctx.op(BO.RESHAPE, [idx, ctx.int_const([1, 1, 1, d])], [r])
            idx = r
        tables.append(idx)
    ctx.op(BO.ROPE, [ctx.tensor(x), *tables], [ctx.output(node)], options("RoPEOptions", mode=GPT_NEOX))
