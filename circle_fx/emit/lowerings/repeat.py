"""``repeat_interleave(x, r, dim)`` with an integer ``r``: RESHAPE -> BROADCAST_TO -> RESHAPE.

Inserting a size-1 axis right after ``dim``, broadcasting it to ``r`` and merging it back
repeats each slice ``r`` times in place (``[a, b] -> [a, a, b, b]``), with no gather.
"""
from __future__ import annotations

import torch

from ...fx_utils import arguments
from ..registry import lowering
from ._common import BO

aten = torch.ops.aten


@lowering(aten.repeat_interleave.self_int)
def repeat_interleave(ctx, node):
    x, repeats, dim = arguments(node)[:3]
    shape = ctx.dims(x, static=True)
    if dim is None:  # repeat_interleave without dim works on the flattened tensor
        shape, dim = [int(torch.Size(shape).numel())], 0
    dim %= len(shape)
    dt = ctx.dtype(node)
    inserted = shape[:dim + 1] + [1] + shape[dim + 1:]
    wide = shape[:dim + 1] + [int(repeats)] + shape[dim + 1:]
    r = ctx.new_tensor(inserted, dt, "unsqueezed")
    ctx.op(BO.RESHAPE, [ctx.tensor(x), ctx.int_const(inserted)], [r])
    b = ctx.new_tensor(wide, dt, "repeated")
    ctx.op(BO.BROADCAST_TO, [r, ctx.int_const(wide)], [b])
    ctx.op(BO.RESHAPE, [b, ctx.int_const(ctx.dims(node, static=True))], [ctx.output(node)])
