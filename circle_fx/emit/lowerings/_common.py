"""Helpers shared by lowerings (options objects, broadcasting scalars)."""
from __future__ import annotations

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


def scalar_dtype(ctx, node, *operands):
    """dtype a Python scalar operand should take: the node's computation dtype."""
    for o in operands:
        if hasattr(o, "meta"):
            return ctx.dtype(node) if ctx.dtype(node) is not None else ctx.dtype(o)
    return ctx.dtype(node)
