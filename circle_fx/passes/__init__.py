"""Pass infrastructure and the built-in passes.

The default pipeline is ``decompose_composites -> rewrite_indexing -> complex_to_real -> decompose ->
canonicalize -> fold_constants -> dce -> fuse_<family>... -> merge_linears -> layout_nhwc -> fold_views -> dce
-> nhwc_pads -> dce``: one fuse pass per registered fusion family
(:mod:`circle_fx.fusions`), named ``fuse_<name>`` (``fuse_rms_norm`` for the built-in RMSNorm
family), in the families' ``order`` (ties in registration order); then sibling linears merged and reshape/transpose chains folded.
Users pass their own list to ``circle_fx.export(..., passes=[...])``, or edit a copy of
the default (:func:`default_pipeline` returns a fresh, editable :class:`Pipeline`).
After the user pipeline, :func:`finalize_pipeline` always runs (the decompose passes + folding + DCE, then
the ``index_facts`` analysis the GATHER lowering reads), because the emitter relies on constant-only
subgraphs being gone.
"""
from __future__ import annotations

from ..fusions import families, get_family
from ..pass_protocol import Pass, PassLike, pass_name
from .canonicalize import Canonicalize
from .dce import DeadCodeElimination
from .decompose import ComplexToReal, DecomposeComposites, DecomposeUnlowered, decompose_passes, rewrite_indexing
from .fold_constants import FoldConstants
from .fuse import FusePatterns, FusionRecord
from .index_facts import AnalyzeIndexing
from ..layout.fold_views import FoldViews
from .manager import Pipeline, run_passes
from .merge_linears import MergeLinears
from ..layout.propagate import NHWCPadsIntoConvs, PropagateNHWC


def fuse_family(family, record_failures: bool = False) -> FusePatterns:
    """The fuse pass of one fusion family (a family object or its registered name)."""
    family = get_family(family) if isinstance(family, str) else family
    return FusePatterns(family.rules, name=family.pass_name, record_failures=record_failures)


def fuse_rms_norm(record_failures: bool = False) -> FusePatterns:
    return fuse_family("rms_norm", record_failures)


def fuse_passes(record_failures: bool = False) -> list[FusePatterns]:
    """One fuse pass per registered family, by the family's ``order`` (ties in registration order)."""
    return [fuse_family(f, record_failures) for f in families()]


def default_pipeline() -> Pipeline:
    """A fresh copy of the default pass list; safe to edit."""
    return Pipeline([*decompose_passes(), Canonicalize(), FoldConstants(), DeadCodeElimination(), *fuse_passes(),
                     MergeLinears(), PropagateNHWC(), FoldViews(), DeadCodeElimination(), NHWCPadsIntoConvs(),
                     DeadCodeElimination()])


def finalize_pipeline() -> Pipeline:
    # decompose too: the emitter has no lowering for composites such as aten.rms_norm, and
    # the approximate decompositions the default pipeline deferred past the fusions happen here
    # last: the analyses the lowerings read, on the graph they lower
    return Pipeline([*decompose_passes(defer=()), Canonicalize(), FoldConstants(), DeadCodeElimination(),
                     AnalyzeIndexing()])


__all__ = ["Pass", "PassLike", "pass_name", "Canonicalize", "DeadCodeElimination", "DecomposeComposites", "ComplexToReal",
           "DecomposeUnlowered", "decompose_passes", "rewrite_indexing", "FoldConstants",
           "FusePatterns", "FusionRecord", "AnalyzeIndexing", "MergeLinears", "PropagateNHWC", "NHWCPadsIntoConvs", "FoldViews", "Pipeline", "run_passes", "fuse_family",
           "fuse_passes", "fuse_rms_norm",
           "default_pipeline", "finalize_pipeline"]
