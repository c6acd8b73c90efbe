"""``constant_pad_nd`` (``F.pad`` with mode "constant") -> PAD, or PADV2 for a non-zero value.

torch lists pads from the LAST dim backwards, ``(left_last, right_last, left_prev, ...)``;
Circle wants an int32 ``[rank, 2]`` table in dim order. Negative pads crop in torch; they
are refused here (STRIDED_SLICE would be the lowering, no model needed it yet).
"""
from __future__ import annotations

import numpy as np
import torch

from ...fx_utils import arguments
from ..registry import lowering
from ._common import BO

aten = torch.ops.aten


def _refused_crop(info, node) -> str | None:
    """PAD takes no negative amounts (a crop)."""
    pads = arguments(node)[1]
    return f"negative padding {list(pads)} (cropping) is not supported" if any(p < 0 for p in pads) else None


@lowering(aten.constant_pad_nd.default, refuses=_refused_crop)
def constant_pad(ctx, node):
    x, pads, value = arguments(node)[:3]
    rank = ctx.rank(x)
    table = np.zeros((rank, 2), dtype=np.int32)
    for i in range(len(pads) // 2):
        table[rank - 1 - i] = (pads[2 * i], pads[2 * i + 1])
    inputs = [ctx.tensor(x), ctx.const(table, "paddings")]
    if value:
        inputs.append(ctx.tensor(value, ctx.dtype(node)))
        ctx.op(BO.PADV2, inputs, [ctx.output(node)])
    else:
        ctx.op(BO.PAD, inputs, [ctx.output(node)])
