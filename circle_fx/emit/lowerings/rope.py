"""``circle.rope(x, sin, cos)`` -> Circle ROPE (builtin -7), mode GPT_NEOX.

onert wants 4-D tables whose last dim is the head dim, in the input order (x, sin, cos),
and a RoPEOptions table (without it the kernel segfaults): tables of one position become
``[1, 1, 1, D]``, others get leading 1s up to rank 4. onert applies the first row to every
position; the fusion creates this op for single-position tables only (circle_fx/fusions/rope.py),
and the ``rope_positions`` legalization step (``emit/legalize/forms.py``) decomposes any other.
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
        if dims[-1] != d or len(dims) > 4 and any(k != 1 for k in dims[:-1]):
            raise ctx.error(f"{name} table {dims}: ROPE takes a table [..., {d}] of rank <= 4")
        want = [1, 1, 1, d] if all(k == 1 for k in dims[:-1]) else [1] * (4 - len(dims)) + dims
        idx = operand(ctx, t, dt)
        if dims != want:
            r = ctx.new_tensor(want, dt, f"{name}4d")
            ctx.op(BO.RESHAPE, [idx, ctx.int_const(want)], [r])
            idx = r
        tables.append(idx)
    ctx.op(BO.ROPE, [ctx.tensor(x), *tables], [ctx.output(node)], options("RoPEOptions", mode=GPT_NEOX))
