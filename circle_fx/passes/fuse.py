"""Fusion: apply rewrite rules (pattern + checks + replacement) across the graph.

One forward sweep over the nodes; at each node only the rules whose pattern root has the
node's op are tried, and each attempt touches at most the pattern's size in nodes, so the
pass is O(nodes x rules-per-op x pattern size) — linear in graph size, never rescanning.
Because the sweep is in topological order, a rule can build on a fusion made earlier in
the same sweep (``rms_norm(x) * w`` absorbs the weight right after the core fused).

With ``record_failures=True`` failed attempts that got some way in are kept in
``program.fusion_log.near_misses`` for :func:`circle_fx.explain`.
"""
from __future__ import annotations

from ..fusion_log import FusionRecord  # noqa: F401  (re-exported: circle_fx.passes.FusionRecord)
from ..patterns.rewrite import Rewrite, apply
from ..patterns.rules import RewriteRules
from ..source import source_line


class FusePatterns(RewriteRules):
    """The rewrite sweep of :class:`~circle_fx.patterns.rules.RewriteRules`, recording each fusion
    (what it merged, from which source line) in ``program.fusion_log.applied``."""

    def __init__(self, rules: list[Rewrite], name: str = "fuse", record_failures: bool = False):
        super().__init__(rules, name, record_failures)

    def near_miss(self, rule: Rewrite, m) -> bool:
        """A failed attempt that got past the pattern's root and one more node."""
        return m.progress >= 2

    def rewrite(self, program, rule: Rewrite, m, node) -> bool:
        """Apply the fusion and record it, absorbing the records of fusions it swallowed."""
        records: dict = program.fusion_log.applied
        merged = [records.pop(n.name) for n in m.nodes if n.name in records and n.op == "call_function"]
        src = merged[0].source if merged else source_line(m.root)
        ops = sum(r.replaced_ops for r in merged) + sum(
            1 for n in m.nodes if n.name not in {r.node for r in merged})
        new = apply(rule, m)
        rules = [x for r in merged for x in r.rules] + [rule.name]
        records[new.name] = FusionRecord(rule.produces or rule.name, new.name, rules, src, ops)
        return True
