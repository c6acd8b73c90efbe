"""A rewrite rule = pattern + checks + replacement, kept as three separate things.

- the :class:`~circle_fx.patterns.pattern.Pattern` says what the subgraph looks like;
- ``checks`` are named predicates on the match (``Match -> None | reason``) for what a
  graph shape cannot say: axes, shapes, dtypes, constness;
- ``replace(match, graph) -> Node`` builds the new node(s) at the root's position.

:func:`try_rewrite` runs them in that order and reports the first failure, so the same
code path serves fusion and ``explain``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch.fx as fx

from ..fx_utils import erase_unused
from .matcher import Match, MatchFailure, match
from .pattern import Pattern

Check = Callable[[Match], Optional[str]]


@dataclass
class Rewrite:
    name: str
    pattern: Pattern
    replace: Callable[[Match, fx.Graph], fx.Node]
    checks: Sequence[Check] = field(default_factory=tuple)
    #: what the rewrite produces, for reports ("rms_norm")
    produces: str = ""

    @property
    def root_target(self):
        return self.pattern.root.target


def try_rewrite(rule: Rewrite, root: fx.Node) -> Match | MatchFailure:
    """Match ``rule`` at ``root`` and run its checks; does not modify the graph."""
    m = match(rule.pattern, root)
    if not m:
        return m
    for check in rule.checks:
        reason = check(m)
        if reason:
            return MatchFailure(rule.pattern, root, reason, root, progress=len(m.nodes) + 1, nodes=m.nodes,
                                check=getattr(check, "__name__", repr(check)))
    return m


def apply(rule: Rewrite, m: Match) -> fx.Node:
    """Replace the matched subgraph by ``rule.replace``'s result; returns the new node."""
    graph = m.root.graph
    with graph.inserting_before(m.root):
        new = rule.replace(m, graph)
    m.root.replace_all_uses_with(new)
    erase_unused(graph, m.nodes)
    return new
