"""Helpers shared by lowerings (options objects, operands in a given dtype)."""
from __future__ import annotations

import torch

from ...circle.schema import BO  # noqa: F401  (re-exported for lowering modules)
from ...circle.schema import make_options as options  # noqa: F401  (re-exported)

#: circle.ActivationFunctionType of a fused ``activation`` argument (``circle.conv2d_nhwc``,
#: ``circle.linear_act`` and the quantized ops built from them): applied per output element
ACTIVATION = {"none": 0, "relu": 1, "relu6": 3}


def operand(ctx, value, dtype: torch.dtype) -> int:
    """Tensor for ``value`` in ``dtype`` (casting, or materialising a scalar):
    :meth:`~circle_fx.emit.context.LoweringContext.operand`."""
    return ctx.operand(value, dtype)
