"""The lowering registry: one small function per torch op (or family of ops).

    @lowering(aten.neg.default)
    def _(ctx, node):
        ctx.op(BO.NEG, [ctx.tensor(node.args[0])], [ctx.output(node)])

Modules under ``circle_fx.emit.lowerings`` register themselves on import; users can
register lowerings for their own custom ops the same way.
"""
from __future__ import annotations

from typing import Callable

LOWERINGS: dict[object, Callable] = {}


def lowering(*targets):
    def register(fn: Callable) -> Callable:
        for t in targets:
            LOWERINGS[t] = fn
        return fn

    return register


def lowering_for(target) -> Callable | None:
    if not LOWERINGS:
        from . import lowerings  # noqa: F401  (registers the built-in lowerings)
    return LOWERINGS.get(target)
