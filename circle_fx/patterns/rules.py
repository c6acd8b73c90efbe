"""A pass of rewrite rules that are not fusions: pattern + named checks + replacement, with
no fusion record (nothing fused; the summary's fusion counts stay the families' own). The
indexing rewrites (``passes/decompose.INDEXING_RULES``) and the view folds
(``layout/fold_views.RULES``) run through it.

One forward sweep, as :class:`~circle_fx.passes.fuse.FusePatterns`: at each node only the
rules whose pattern root has its op are tried. A rule's *first* check says whether the node
is the form the rule is about at all (a single-tensor index is no multi-index rewrite's
candidate); a later check that refuses is a near miss, kept in
``program.fusion_log.near_misses`` when ``record_failures`` (what :func:`circle_fx.explain`
reports). A replacement may still return None (the form turned out not to apply once
built); the node is then left as it is.
"""
from __future__ import annotations

from collections import defaultdict

from ..fx_utils import erase_unused
from ..pass_protocol import Pass
from .rewrite import Rewrite, try_rewrite


def _check_name(check) -> str:
    return getattr(check, "__name__", repr(check))


class RewriteRules(Pass):
    """Rules indexed by their pattern root's op (:class:`~circle_fx.passes.fuse.FusePatterns`
    is this sweep with fusion records)."""

    def __init__(self, rules: list[Rewrite], name: str, record_failures: bool = False):
        super().__init__()
        self.name = name
        self.rules = list(rules)
        self.record_failures = record_failures
        self._by_root = defaultdict(list)
        for r in self.rules:
            self._by_root[r.root_target].append(r)

    def rules_for(self, node) -> list[Rewrite]:
        """The rules whose pattern root has ``node``'s op, in rule order."""
        return self._by_root.get(node.target, []) if node.op == "call_function" else []

    def near_miss(self, rule: Rewrite, m) -> bool:
        """Whether a failed attempt is worth recording: a later check than the first refused."""
        return m.check is not None and m.check != _check_name(rule.checks[0])

    def rewrite(self, program, rule: Rewrite, m, node) -> bool:
        """Replace the match; False when the replacement declines (the node is left as it is)."""
        g = program.gm.graph
        with g.inserting_before(node):
            new = rule.replace(m, g)
        if new is None:
            return False
        node.replace_all_uses_with(new)
        erase_unused(g, m.nodes)
        return True

    def run(self, program) -> bool:
        g = program.gm.graph
        misses = program.fusion_log.near_misses if self.record_failures else None
        changed = False
        for node in list(g.nodes):
            if getattr(node, "_erased", False) or node.op != "call_function":
                continue
            for rule in self.rules_for(node):
                m = try_rewrite(rule, node)
                if not m:
                    if misses is not None and self.near_miss(rule, m):
                        misses.append(m)
                    continue
                if self.rewrite(program, rule, m, node):
                    changed = True
                    break
        return changed
