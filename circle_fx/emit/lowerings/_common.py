"""Helpers shared by lowerings (options objects, operands in a given dtype)."""
from __future__ import annotations

import torch
import torch.fx as fx
from circle_schema import circle

from ..builder import BO  # noqa: F401  (re-exported for lowering modules)

C = circle


def options(name: str, **fields):
    """``options("AddOptions", fusedActivationFunction=0)`` -> a populated ``AddOptionsT``."""
    mod = getattr(C, name)
    obj = getattr(mod, name + "T")()
    for k, v in fields.items():
        if not hasattr(obj, k):
            raise AttributeError(f"{name} has no field {k}")
        setattr(obj, k, v)
    return obj


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
