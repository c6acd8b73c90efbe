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
from ..patterns.rewrite import Rewrite, apply, try_rewrite
from ..patterns.rules import RewriteRules
from ..source import source_line


class FusePatterns(RewriteRules):
    """The rewrite sweep of :class:`~circle_fx.patterns.rules.RewriteRules`, recording each fusion
    (what it merged, from which source line) in ``program.fusion_log.applied``."""

    def __init__(self, rules: list[Rewrite], name: str = "fuse", record_failures: bool = False):
        super().__init__(rules, name, record_failures)

    def run(self, program) -> bool:
        g = program.gm.graph
        records: dict = program.fusion_log.applied
        misses = program.fusion_log.near_misses if self.record_failures else None
        changed = False
        for node in list(g.nodes):
            if getattr(node, "_erased", False) or node.op != "call_function":
                continue
            for rule in self.rules_for(node):
                m = try_rewrite(rule, node)
                if not m:
                    if misses is not None and m.progress >= 2:
                        misses.append(m)
                    continue
                merged = [records.pop(n.name) for n in m.nodes if n.name in records and n.op == "call_function"]
                src = merged[0].source if merged else source_line(m.root)
                ops = sum(r.replaced_ops for r in merged) + sum(
                    1 for n in m.nodes if n.name not in {r.node for r in merged})
                new = apply(rule, m)
                rules = [x for r in merged for x in r.rules] + [rule.name]
                records[new.name] = FusionRecord(rule.produces or rule.name, new.name, rules, src, ops)
                changed = True
                break
        return changed
