"""The one store of what fusion did to a :class:`~circle_fx.program.Program`.

Applied fusions and near misses used to live in two places (the GraphModule's meta and
an untyped notes dict), copied again into the export report. Now the fuse passes and the
decompose step write here, and the summary, the CLI and ``explain`` read from here.
It holds no graph: records name nodes by string, so a report built from it does not keep
the FX graph alive (near misses do reference nodes; they are only kept when ``explain``
asks for them, and never copied into an export report).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FusionRecord:
    """One fused subgraph: what it became, which rules built it, where it came from."""

    kind: str
    node: str
    rules: list[str]
    source: str
    replaced_ops: int = 0
    details: dict = field(default_factory=dict)


@dataclass
class FusionLog:
    #: fused node name -> record, in the order made (a later rule that absorbs an earlier
    #: fused node pops its record and merges it)
    applied: dict = field(default_factory=dict)
    #: ``MatchFailure`` s that got some way in, when a fuse pass has ``record_failures``
    near_misses: list = field(default_factory=list)

    def fusions(self) -> list[FusionRecord]:
        return list(self.applied.values())
