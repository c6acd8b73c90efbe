"""The fusion-family registry: everything one kind of fusion owns, in one record.

A :class:`FusionFamily` bundles what used to be spread over the passes, ``explain``, the
emitter and the decompose and canonicalize steps: the rewrite rules (pattern + checks +
replacement), the custom op they produce (each family module defines its op with
:func:`circle_fx.dialect.define`, traits included), the op's lowering to Circle, the
canonicalizing rules for other spellings, the composite aten ops that map straight onto that op
(``aten.rms_norm`` -> ``circle.rms_norm``), the *candidate* hints ``explain`` uses to find
subgraphs that look like the family but did not fuse, and where its fuse pass runs (``order``).
``default_pipeline()``, the decompose pass, the emitter's lowering table and ``explain`` iterate
:func:`families`, so adding a family with a new op is one new module that calls
:func:`register_family` (``circle_fx/fusions/silu.py`` is the smallest complete one).

This module imports neither the passes, the emitter nor ``explain`` (they import it), so there
is no import cycle: the emitter's registry learns of families through :func:`on_register`.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch.fx as fx

from ..patterns.rewrite import Rewrite

#: ``(node, graph) -> replacement node | None``; inserted before ``node`` by the decompose pass
CompositeRule = Callable[[fx.Node, fx.Graph], Optional[fx.Node]]


@dataclass(frozen=True)
class Candidate:
    """An ``explain`` hint: a node for which ``detect(node)`` is true after fusion looks
    like an unfused member of the family, and is explained by the rule attempts rooted at
    most ``hops`` users downstream of it."""

    detect: Callable[[fx.Node], bool]
    #: entry kind in the report (default: the family name)
    kind: str = ""
    hops: int = 6
    #: only report when a rule's shape matched and a check refused (a partial fusion)
    require_check: bool = False
    #: skip a node a few hops below an already reported candidate (one entry per subgraph)
    skip_near_reported: bool = False


@dataclass
class FusionFamily:
    """One kind of fusion: its rules, the op they produce, composites it owns, explain hints."""

    name: str
    rules: Sequence[Rewrite]
    #: the custom op the rules produce (e.g. ``torch.ops.circle.rms_norm.default``)
    op: object = None
    #: composite aten op -> rewrite into ``op`` (or primitives); run by the decompose pass
    composites: dict = field(default_factory=dict)
    candidates: Sequence[Candidate] = ()
    #: canonicalizing rules ``(node, graph) -> replacement | None`` that bring other spellings
    #: to the form the rules match; the canonicalize pass runs every family's
    canonical: Sequence[Callable] = ()
    #: what ``explain`` says when no rule is rooted near a candidate
    no_rule_hint: str = ""
    #: how messages name the family ("RMSNorm"); default: ``name``
    title: str = ""
    #: where its fuse pass runs: ascending, ties in registration order (a family whose rules
    #: match another's result runs after it: ``fused_activation`` after ``conv_batch_norm``)
    order: int = 1000
    #: the lowering of ``op`` when the family defines the op: ``fn(ctx, node)`` written against
    #: ``LoweringContext`` like any built-in lowering (registered by ``circle_fx.emit.registry``);
    #: None when ``op`` already has one (an aten op, or an op several families produce)
    lowering: Optional[Callable] = None
    #: the forms ``lowering`` refuses: ``why(info, node) -> str | None`` (see ``emit.registry``)
    refuses: Optional[Callable] = None

    def __post_init__(self):
        self.title = self.title or self.name
        self.no_rule_hint = self.no_rule_hint or f"no {self.title} rule is rooted near it"

    @property
    def pass_name(self) -> str:
        """The fuse pass's name in the pipeline (``fuse_rms_norm``): user code edits it by name."""
        return f"fuse_{self.name}"


_FAMILIES: dict[str, FusionFamily] = {}
#: called with each family as it is registered (the emitter registers the family's lowering)
_LISTENERS: list[Callable[[FusionFamily], None]] = []


def register_family(family: FusionFamily) -> FusionFamily:
    """Add ``family`` (or replace one of the same name, with a warning); returns it."""
    if family.name in _FAMILIES and _FAMILIES[family.name] is not family:
        warnings.warn(f"fusion family {family.name!r} registered again; the new one replaces the old",
                      stacklevel=2)
    if family.lowering is not None and family.op is None:
        raise ValueError(f"fusion family {family.name!r} has a lowering but no op to lower")
    _FAMILIES[family.name] = family
    for listener in _LISTENERS:
        listener(family)
    return family


def on_register(listener: Callable[[FusionFamily], None]) -> None:
    """Call ``listener`` for every family registered so far and every one registered later."""
    _LISTENERS.append(listener)
    for family in list(_FAMILIES.values()):
        listener(family)


def unregister_family(name: str) -> FusionFamily:
    return _FAMILIES.pop(name)


def families() -> list[FusionFamily]:
    """The registered families in the order their fuse passes run: by ``order``, ties in
    registration order."""
    return sorted(_FAMILIES.values(), key=lambda f: f.order)


def get_family(name: str) -> FusionFamily:
    try:
        return _FAMILIES[name]
    except KeyError:
        raise KeyError(f"no fusion family {name!r}; registered: {list(_FAMILIES)}") from None


def canonical_rules() -> list:
    """Every family's canonicalizing rules, in family order."""
    return [rule for f in families() for rule in f.canonical]


def composite_rules() -> dict:
    """aten op -> (family, rule) for every composite a family owns."""
    return {op: (f, rule) for f in families() for op, rule in f.composites.items()}
