"""Helpers shared by lowerings (options objects, operands in a given dtype)."""
from __future__ import annotations

import torch
import torch.fx as fx

from ...circle.schema import BO  # noqa: F401  (re-exported for lowering modules)
from ...circle.schema import make_options as options  # noqa: F401  (re-exported)

#: circle.ActivationFunctionType of a fused ``activation`` argument (``circle.conv2d_nhwc``,
#: ``circle.linear_act`` and the quantized ops built from them): applied per output element
ACTIVATION = {"none": 0, "relu": 1, "relu6": 3}


def operand(ctx, value, dtype: torch.dtype) -> int:
    """Tensor for ``value`` in ``dtype`` (casting, or materialising a scalar)."""
    if not isinstance(value, fx.Node):
        return ctx.tensor(value, dtype)
    idx = ctx.tensor(value)
    if ctx.dtype(value) == dtype:
        return idx
    out = ctx.like(value, f"{value.name}_cast", dtype)
    ctx.op(BO.CAST, [idx], [out])
    return out
