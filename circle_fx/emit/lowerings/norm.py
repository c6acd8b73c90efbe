"""``circle.rms_norm`` -> Circle's builtin ``RMS_NORM`` (gamma is ones when unweighted).

onert's RMS_NORM kernel accepts only 3-D and 4-D inputs, so other ranks are reshaped to
``[1, rows, D]`` around it (a free metadata change for row-major tensors).
"""
from __future__ import annotations

import numpy as np

from ...ops import rms_norm
from ..registry import lowering
from ..types import numpy_dtype
from ._common import BO, options


@lowering(rms_norm)
def lower_rms_norm(ctx, node):
    x, weight, eps = node.args
    if weight is None:
        d = ctx.static_shape(x)[-1]
        gamma = ctx.const(np.ones([d], dtype=numpy_dtype(ctx.dtype(x))), "ones")
    else:
        gamma = ctx.tensor(weight)
        if ctx.dtype(weight) != ctx.dtype(x):
            from .elementwise import operand

            gamma = operand(ctx, weight, ctx.dtype(x))
    shape = ctx.static_shape(x)
    opts = options("RmsNormOptions", epsilon=float(eps))
    if len(shape) in (3, 4):
        ctx.op(BO.RMS_NORM, [ctx.tensor(x), gamma], [ctx.output(node)], opts)
        return
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    as3d = [1, rows, shape[-1]]
    x3 = ctx.new_tensor(as3d, ctx.dtype(x), "in3d")
    ctx.op(BO.RESHAPE, [ctx.tensor(x), ctx.int_const(as3d)], [x3])
    y3 = ctx.new_tensor(as3d, ctx.dtype(node), "out3d")
    ctx.op(BO.RMS_NORM, [x3, gamma], [y3], opts)
    ctx.op(BO.RESHAPE, [y3, ctx.int_const(shape)], [ctx.output(node)])
