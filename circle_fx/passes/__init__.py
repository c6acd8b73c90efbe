"""Pass infrastructure and the built-in passes.

The default pipeline is ``decompose -> canonicalize -> fold_constants -> dce -> fuse_rms_norm -> dce``.
Users pass their own list to ``circle_fx.export(..., passes=[...])``, or edit a copy of
the default (:func:`default_pipeline` returns a fresh, editable :class:`Pipeline`).
After the user pipeline, :func:`finalize_pipeline` always runs (decompose + folding + DCE), because
the emitter relies on constant-only subgraphs being gone.
"""
from __future__ import annotations

from .base import Pass, PassLike, pass_name
from .canonicalize import Canonicalize
from .dce import DeadCodeElimination
from .decompose import DecomposeComposites
from .fold_constants import FoldConstants
from .fuse import FusePatterns, FusionRecord
from .manager import Pipeline, run_passes


def fuse_rms_norm(record_failures: bool = False) -> FusePatterns:
    from ..patterns.rms_norm import RULES

    return FusePatterns(RULES, name="fuse_rms_norm", record_failures=record_failures)


def default_pipeline() -> Pipeline:
    """A fresh copy of the default pass list; safe to edit."""
    return Pipeline([DecomposeComposites(), Canonicalize(), FoldConstants(), DeadCodeElimination(), fuse_rms_norm(),
                     DeadCodeElimination()])


def finalize_pipeline() -> Pipeline:
    # decompose too: the emitter has no lowering for composites such as aten.rms_norm
    return Pipeline([DecomposeComposites(), Canonicalize(), FoldConstants(), DeadCodeElimination()])


__all__ = ["Pass", "PassLike", "pass_name", "Canonicalize", "DeadCodeElimination", "DecomposeComposites", "FoldConstants",
           "FusePatterns", "FusionRecord", "Pipeline", "run_passes", "fuse_rms_norm",
           "default_pipeline", "finalize_pipeline"]
