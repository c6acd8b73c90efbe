"""``circle.rms_norm`` -> Circle's builtin ``RMS_NORM`` (gamma is ones when unweighted).

Any rank, any shape: onert's RMS_NORM kernel accepts only 3-D and 4-D inputs, and the ``ranks``
legalization step (``emit/legalize/ranks.py``) reshapes other ranks to ``[1, rows, D]``
around it; it runs static shapes only, and the ``dynamic_rms_norm`` step
(``emit/legalize/forms.py``) decomposes one with a dynamic dim.
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
    ctx.op(BO.RMS_NORM, [ctx.tensor(x), gamma], [ctx.output(node)], options("RmsNormOptions", epsilon=float(eps)))
