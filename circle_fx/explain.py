"""``explain``: why did (or didn't) my norm fuse?

Runs the normal pass pipeline with every fusion family's pass recording its failed
attempts, then looks at what is left in the graph for things that look like an unfused
member of a family:

- *candidates*: what each family's :class:`~circle_fx.fusions.Candidate` hints detect
  (for RMSNorm: reductions of a square-like value and ``rsqrt`` nodes that survived
  fusion, plus fused nodes whose weight multiplication was refused);
- for each candidate, every attempt of that family rooted at most ``hops`` users downstream is a
  possible explanation (the recorded ones from the fuse pass, and a fresh attempt on the
  final graph for roots the pass did not record because they failed at the first op);
- the best attempt wins: one that reached the candidate; then a rule *check* failing
  after the whole shape matched beats a shape mismatch; then one that failed on a value
  computed from the candidate (not on some unrelated operand); then the root nearest the
  candidate, then the one that got furthest, then the smallest pattern (simplest story).

Each entry names the candidate and its source line, the rule, the failed condition, and
where in the user's source the failure was found. The rewrites no family owns (the pipeline's
:class:`~circle_fx.patterns.RewriteRules` passes: ``rewrite_indexing``, ``fold_views``) report
theirs too, as ``rewrite <rule>`` entries: a node of a rule's form that a later named check
refused (``masked_rows``' ``row_wise`` on a running sum across the selected rows). Nodes left in the final graph whose
lowering refuses their form (``@lowering(..., refuses=...)``) are listed with the reason.
For quantization, the SmoothQuant folds (``circle_fx/quant/smooth_rules.py``) are looked for
right after RMSNorm fusion, as ``CircleQuantizer(smooth_quant=...)`` sees the graph: how many
groups fold exactly, and each skipped candidate with the rule and check that refused it.
``explain`` never changes the model and never emits a Circle file.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch.fx as fx

from .emit.registry import refusal
from .fusions import families
from .passes import default_pipeline, finalize_pipeline, fuse_family, run_passes
from .passes.fuse import FusePatterns
from .patterns import RewriteRules
from .patterns.matcher import MatchFailure
from .patterns.rewrite import try_rewrite
from .quant.smooth_rules import SEES_GRAPH_AFTER, smooth_candidates
from .source import describe, op_name, source_line


@dataclass
class NearMiss:
    """One candidate that did not (fully) fuse, and the best explanation found."""

    kind: str
    #: ``%name = aten.op`` of the candidate node
    candidate: str
    #: the user's source line that produced the candidate
    source: str
    #: the rewrite rule whose attempt got furthest (None when no rule reached the candidate)
    rule: str | None
    #: which condition failed, in words
    reason: str
    #: the source line where the failing condition was found
    where: str | None = None
    #: name of the failed rule check, when the shape matched and a check said no
    check: str | None = None

    def format(self) -> str:
        lines = [f"{self.kind} candidate {self.candidate}", f"    source: {self.source}"]
        lines.append(f"    why:    {self.reason}" + (f"  [rule {self.rule}]" if self.rule else ""))
        if self.check:
            lines.append(f"    check:  {self.check}")
        if self.where and self.where != self.source:
            lines.append(f"    at:     {self.where}")
        return "\n".join(lines)


@dataclass
class Fused:
    kind: str
    node: str
    rules: list[str]
    source: str


@dataclass
class Refused:
    """A node whose op has a lowering that refuses this form of it (export would fail)."""

    op: str
    node: str
    source: str
    reason: str


@dataclass
class ExplainResult:
    """What ``explain`` found: the fusions applied, the near misses (``entries``) and the
    nodes their lowering refuses (``refused``)."""

    fused: list[Fused] = field(default_factory=list)
    entries: list[NearMiss] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)
    #: SmoothQuant: the kinds of the groups whose scale folds exactly, and the skipped
    #: candidates (``circle_fx.quant.smooth_rules.Skipped``)
    smooth_groups: list[str] = field(default_factory=list)
    smooth_skipped: list = field(default_factory=list)

    def __iter__(self) -> Iterator[NearMiss]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def format(self) -> str:
        lines = [f"fused: {len(self.fused)}"]
        for f in self.fused:
            lines.append(f"  {f.kind} {f.node} [{' + '.join(f.rules)}] from {f.source}")
        lines.append(f"not fused: {len(self.entries)}")
        for i, e in enumerate(self.entries, 1):
            body = e.format().splitlines()
            lines.append(f"  {i}. {body[0]}")
            lines.extend("  " + b for b in body[1:])
        if not self.entries:
            lines.append("  (no near misses: every fusion candidate fused)")
        if self.refused:
            lines.append(f"refused by their lowering: {len(self.refused)}")
            lines.extend(f"  {r.op} %{r.node} at {r.source}: {r.reason}" for r in self.refused)
        if self.smooth_groups or self.smooth_skipped:
            kinds = ", ".join(f"{self.smooth_groups.count(k)} {k}" for k in dict.fromkeys(self.smooth_groups))
            lines.append(f"SmoothQuant folds (CircleQuantizer(smooth_quant=...)): {len(self.smooth_groups)} exact"
                         + (f" ({kinds})" if kinds else "") + f", {len(self.smooth_skipped)} skipped")
            for i, e in enumerate(self.smooth_skipped, 1):
                body = e.format().splitlines()
                lines.append(f"  {i}. {body[0]}")
                lines.extend("  " + b for b in body[1:])
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def explain(model, example_inputs, *, example_kwargs: dict | None = None, dynamic_shapes=None) -> ExplainResult:
    """Capture ``model`` and report which subgraphs fused and, for each that almost did,
    which condition failed and where in the source."""
    from .api import capture

    program = capture(model, example_inputs, example_kwargs, dynamic_shapes)
    return explain_program(program)


def explain_report(model, example_inputs, **kwargs) -> str:
    """:func:`explain` as text (what ``circle-fx explain`` prints)."""
    return explain(model, example_inputs, **kwargs).format()


def explain_program(program) -> ExplainResult:
    """:func:`explain` on an already captured :class:`~circle_fx.program.Program` (modified in place)."""
    pipeline = default_pipeline()
    fuses = []  # (family, its recording fuse pass)
    for family in families():
        fuse = fuse_family(family, record_failures=True)
        if family.pass_name in pipeline.names():
            pipeline.replace(family.pass_name, fuse)
        fuses.append((family, fuse))
    result = ExplainResult()

    def smooth_quant_candidates(program) -> bool:  # what smooth_quant sees: the RMSNorm-fused graph
        groups, result.smooth_skipped = smooth_candidates(program.gm)
        result.smooth_groups = [g.kind for g in groups]
        return False

    if SEES_GRAPH_AFTER in pipeline.names():
        pipeline.insert_after(SEES_GRAPH_AFTER, smooth_quant_candidates)
    for p in pipeline:  # the rule passes no family owns (rewrite_indexing, fold_views) keep their near misses
        if isinstance(p, RewriteRules) and not isinstance(p, FusePatterns):  # fusions: their own passes above
            p.record_failures = True
    run_passes(program, pipeline)
    family_patterns = {id(r.pattern) for _, fuse in fuses for r in fuse.rules}
    for f in program.fusion_log.near_misses:  # a named check refused a rewrite's candidate
        if id(f.pattern) not in family_patterns and f.check is not None:
            result.entries.append(NearMiss(f"rewrite {f.pattern.name}", describe_short(f.root), source_line(f.root),
                                           f.pattern.name, f.reason, check=f.check))
    graph = program.gm.graph
    # candidates are looked for where the fusions left the graph: finalize_pipeline then
    # decomposes what they may match (erf, deferred past them as an approximation)
    # by root, each with its position so candidates see them in recording order
    recorded: dict[fx.Node, list] = {}
    for i, f in enumerate(program.fusion_log.near_misses):
        if _alive(f.root):
            recorded.setdefault(f.root, []).append((i, f))

    for rec in program.fusions():
        result.fused.append(Fused(rec.kind, rec.node, list(rec.rules), rec.source))

    reported: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        entry = None
        for family, fuse, hint in ((f, p, h) for f, p in fuses for h in f.candidates):
            if not hint.detect(node) or (hint.skip_near_reported and _near(node, reported)):
                continue
            entry = _explain_candidate(node, family, fuse, recorded, hint)
            break
        if entry is not None:
            reported.add(node)
            result.entries.append(entry)
    # refusals on the graph the emitter will see
    run_passes(program, finalize_pipeline())
    for node in program.gm.graph.nodes:
        if node.op == "call_function" and (reason := refusal(node)) is not None:
            result.refused.append(Refused(op_name(node.target), node.name, source_line(node), reason))
    return result


# ------------------------------------------------------------------------------ helpers

def _alive(n: fx.Node) -> bool:
    return isinstance(n, fx.Node) and not getattr(n, "_erased", False) and n.graph is not None


def _downstream(node: fx.Node, hops: int) -> list[fx.Node]:
    """``node`` and its users up to ``hops`` edges away, nearest first."""
    seen = {node: 0}
    frontier = [node]
    for depth in range(1, hops + 1):
        nxt = []
        for n in frontier:
            for u in n.users:
                if u not in seen and u.op == "call_function":
                    seen[u] = depth
                    nxt.append(u)
        frontier = nxt
    return list(seen)


def _near(node: fx.Node, reported: set) -> bool:
    """Is a reported candidate within a few hops upstream of ``node``? (one entry per norm)"""
    frontier, seen = [node], {node}
    for _ in range(4):
        nxt = []
        for n in frontier:
            for i in n.all_input_nodes:
                if i in reported:
                    return True
                if i not in seen:
                    seen.add(i)
                    nxt.append(i)
        frontier = nxt
    return False


def _explain_candidate(node, family, fuse, recorded, hint):
    hops, require_check = hint.hops, hint.require_check
    rule_names = {id(r.pattern): r.name for r in fuse.rules}
    roots = _downstream(node, hops)
    depth = {n: i for i, n in enumerate(roots)}
    failures: list[tuple[MatchFailure, str]] = [  # this family's recorded attempts only
        (f, rule_names[id(f.pattern)])
        for _, f in sorted((r for root in roots for r in recorded.get(root, ())), key=lambda r: r[0])
        if id(f.pattern) in rule_names]
    for root in roots:  # fresh attempts on the final graph (cover first-op failures the pass skips)
        for rule in fuse.rules_for(root):
            m = try_rewrite(rule, root)
            if not m:
                failures.append((m, rule.name))
    if require_check:
        # a check refused a complete match that reads the candidate or holds it
        failures = [(f, r) for f, r in failures if f.check is not None and (f.root in node.users or node in f.nodes)]
    if not failures and require_check:
        return None

    def rank(item):
        f, _ = item
        reached = node in f.nodes or f.root is node
        # nearest root before progress: a bigger pattern rooted further down can "progress"
        # further by binding the wrong operands (x := weight) and explain nothing
        touched = f.at in depth  # failed on a value computed from the candidate
        return (reached, f.check is not None, touched, -depth.get(f.root, hops), f.progress, -f.pattern.size)

    kind = hint.kind or family.name
    if not failures:
        return NearMiss(kind, describe_short(node), source_line(node), None, family.no_rule_hint)
    best, rule = max(failures, key=rank)
    reason = best.reason
    if not (node in best.nodes or best.root is node):
        reason = f"the nearest {family.title} attempt did not reach it: {reason}"
    where = source_line(best.at) if best.at is not None else None
    return NearMiss(kind, describe_short(node), source_line(node), rule, reason, where, best.check)


def describe_short(node: fx.Node) -> str:
    """``%name = aten.op`` without the source (shown on its own line)."""
    return describe(node).split(" at ", 1)[0]
