"""``circle.rms_norm`` -> Circle's builtin ``RMS_NORM`` (gamma is ones when unweighted).

Any rank: onert's RMS_NORM kernel accepts only 3-D and 4-D inputs, and the ``ranks``
legalization step (``emit/legalize/ranks.py``) reshapes other ranks to ``[1, rows, D]``
around it. Inputs with a dynamic dim are lowered decomposed instead (see ``_decomposed``).
"""
from __future__ import annotations

import numpy as np

from ...fusions.rms_norm import rms_norm
from ..registry import lowering
from ..types import numpy_dtype
from ._common import BO, operand, options


@lowering(rms_norm)
def lower_rms_norm(ctx, node):
    x, weight, eps = node.args
    if weight is None:
        d = ctx.shape_hint(x)[-1]
        gamma = ctx.const(np.ones([d], dtype=numpy_dtype(ctx.dtype(x))), "ones")
    else:
        gamma = operand(ctx, weight, ctx.dtype(x))  # CAST when the weight's dtype differs
    if ctx.is_dynamic(x):
        _decomposed(ctx, node, x, gamma, eps)
        return
    ctx.op(BO.RMS_NORM, [ctx.tensor(x), gamma], [ctx.output(node)], options("RmsNormOptions", epsilon=float(eps)))


def _decomposed(ctx, node, x, gamma, eps):
    """``x * rsqrt(mean(x*x, -1) + eps) * gamma`` as MUL/MEAN/ADD/RSQRT/MUL/MUL.

    onert 0.1.0's RMS_NORM cannot take dynamic shapes (its shape validator fails, or it
    silently keeps the old shape when the input is resized), so inputs with a dynamic dim
    use the decomposed form, which onert resizes correctly.
    """
    dt = ctx.dtype(x)
    dims, hint = ctx.dims(x), ctx.shape_hint(x)
    xt = ctx.tensor(x)
    sq = ctx.like(x, "square")
    ctx.op(BO.MUL, [xt, xt], [sq], options("MulOptions"))
    col, col_hint = dims[:-1] + [1], hint[:-1] + [1]  # one value per row
    ms = ctx.new_tensor(col, dt, "mean_square", col_hint)
    ctx.op(BO.MEAN, [sq, ctx.int_const([len(dims) - 1], "axes")], [ms], options("ReducerOptions", keepDims=True))
    var = ctx.new_tensor(col, dt, "plus_eps", col_hint)
    ctx.op(BO.ADD, [ms, ctx.const(np.array(eps, dtype=numpy_dtype(dt)), "eps")], [var], options("AddOptions"))
    inv = ctx.new_tensor(col, dt, "rsqrt", col_hint)
    ctx.op(BO.RSQRT, [var], [inv])
    normed = ctx.like(x, "normed")
    ctx.op(BO.MUL, [xt, inv], [normed], options("MulOptions"))
    ctx.op(BO.MUL, [normed, gamma], [ctx.output(node)], options("MulOptions"))
