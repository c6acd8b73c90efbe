"""The lowering registry: one small function per torch op (or family of ops).

    @lowering(aten.neg.default)
    def _(ctx, node):
        ctx.op(BO.NEG, [ctx.tensor(node.args[0])], [ctx.output(node)])

The built-in lowerings (every module under ``circle_fx.emit.lowerings``, and the quantized
ops' lowerings under ``circle_fx.quant.lowerings``: :data:`BUILTIN_PACKAGES`) are registered
when ``circle_fx`` is imported, i.e. before any user code can call :func:`lowering`:
a user lowering for a new op only adds to the table. Registering a target that already has
a lowering replaces it and warns (``override=True`` says it is meant), so a typo'd or
duplicated registration cannot silently change what an existing op becomes.
"""
from __future__ import annotations

import warnings
from typing import Callable

from ..source import op_name

LOWERINGS: dict[object, Callable] = {}


def _describe(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def lowering(*targets, override: bool = False):
    """Register the decorated function as the lowering of each of ``targets``."""
    def register(fn: Callable) -> Callable:
        for t in targets:
            old = LOWERINGS.get(t)
            if old is not None and old is not fn and not override:
                warnings.warn(f"lowering for {op_name(t)} re-registered: {_describe(fn)} replaces "
                              f"{_describe(old)} (pass override=True to lowering() if this is intended)",
                              stacklevel=2)
            LOWERINGS[t] = fn
        return fn

    return register


def lowering_for(target) -> Callable | None:
    return LOWERINGS.get(target)


#: packages whose modules hold built-in lowerings (imported eagerly with circle_fx)
BUILTIN_PACKAGES = ("circle_fx.emit.lowerings", "circle_fx.quant.lowerings")


def builtin_targets(packages=BUILTIN_PACKAGES) -> set:
    """Targets whose lowering is a built-in one (defined in a module under one of ``packages``)."""
    prefixes = tuple(f"{p}." for p in packages)
    return {t for t, fn in LOWERINGS.items() if getattr(fn, "__module__", "").startswith(prefixes)}
