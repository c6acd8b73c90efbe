"""The lowering registry: one small function per torch op (or family of ops).

    @lowering(aten.neg.default)
    def _(ctx, node):
        ctx.op(BO.NEG, [ctx.tensor(node.args[0])], [ctx.output(node)])

The built-in lowerings (every module under ``circle_fx.emit.lowerings``, the quantized
ops' lowerings under ``circle_fx.quant.lowerings``, and the lowering each fusion family of
``circle_fx.fusions`` carries for its own op: :data:`BUILTIN_PACKAGES`) are registered
when ``circle_fx`` is imported, i.e. before any user code can call :func:`lowering`:
a user lowering for a new op only adds to the table. A family's lowering
(``FusionFamily.lowering``) is registered when the family is (:func:`_register_family`), a user
family's too. Registering a target that already has
a lowering replaces it and warns (``override=True`` says it is meant), so a typo'd or
duplicated registration cannot silently change what an existing op becomes.

A lowering that takes only some forms of its op says so where it is registered, once:
``@lowering(target, refuses=why)`` with ``why(info, node)`` returning the reason a node is
refused (None: lowered). ``info`` answers ``dims`` / ``rank`` / ``dtype`` / ``shape_hint``
like a :class:`~circle_fx.emit.context.LoweringContext`, before any Circle is emitted. Passes
ask :func:`refusal` (``decompose_unlowered`` rewrites a refused node into forms that lower),
the emitter reports the nodes still refused together with the ops that have no lowering, and
``explain`` lists them.
"""
from __future__ import annotations

import warnings
from typing import Callable

from ..fusions.registry import on_register
from ..source import op_name

LOWERINGS: dict[object, Callable] = {}
#: target -> ``why(info, node) -> str | None``: the forms its lowering refuses
REFUSALS: dict[object, Callable] = {}


def _describe(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def lowering(*targets, override: bool = False, refuses: Callable | None = None):
    """Register the decorated function as the lowering of each of ``targets`` (``refuses``:
    the reason it refuses a node, see the module docstring)."""
    def register(fn: Callable) -> Callable:
        for t in targets:
            old = LOWERINGS.get(t)
            if old is not None and old is not fn and not override:
                warnings.warn(f"lowering for {op_name(t)} re-registered: {_describe(fn)} replaces "
                              f"{_describe(old)} (pass override=True to lowering() if this is intended)",
                              stacklevel=2)
            LOWERINGS[t] = fn
            if refuses is not None:
                REFUSALS[t] = refuses
            elif old is not fn:  # a new lowering takes what it does not refuse
                REFUSALS.pop(t, None)
        return fn

    return register


def lowering_for(target) -> Callable | None:
    return LOWERINGS.get(target)


def refusal(node) -> str | None:
    """Why the lowering of ``node``'s op refuses this node (None: it lowers it, or the op has
    no lowering at all)."""
    why = REFUSALS.get(getattr(node, "target", None)) if getattr(node, "op", None) == "call_function" else None
    if why is None:
        return None
    from .context import NodeInfo

    return why(NodeInfo(node), node)


#: packages whose modules hold built-in lowerings (imported eagerly with circle_fx; the fusion
#: families' lowerings are their ``FusionFamily.lowering``)
BUILTIN_PACKAGES = ("circle_fx.emit.lowerings", "circle_fx.quant.lowerings", "circle_fx.fusions")


def builtin_targets(packages=BUILTIN_PACKAGES) -> set:
    """Targets whose lowering is a built-in one (defined in a module under one of ``packages``).
    The caller loads the compiler first (``circle_fx.load_compiler()``): ``import circle_fx``
    alone registers nothing (it is lazy, so a torch-free runner can import it), and emit may not
    import the root package (docs/architecture.md), so a guard iterating this must do it."""
    prefixes = tuple(f"{p}." for p in packages)
    return {t for t, fn in LOWERINGS.items() if getattr(fn, "__module__", "").startswith(prefixes)}


def _register_family(family) -> None:
    """Register the lowering a fusion family carries for its op (none: the op has its own)."""
    if family.lowering is not None:
        lowering(family.op, refuses=family.refuses)(family.lowering)


on_register(_register_family)
