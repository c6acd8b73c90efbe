"""The pattern language: patterns (:mod:`.pattern`), matcher (:mod:`.matcher`), rewrite
rules (:mod:`.rewrite`) and the pass that sweeps non-fusion rules over a graph (:mod:`.rules`).
The rules written in it live with their fusion family in :mod:`circle_fx.fusions`, or, for
rewrites no family owns, in :mod:`circle_fx.passes` (``decompose.INDEXING_RULES``) and
:mod:`circle_fx.layout` (``fold_views.RULES``)."""
from .matcher import Match, MatchFailure, match
from .pattern import Pattern, moved, op_pattern, optional_cast, pattern
from .rewrite import Rewrite, apply, try_rewrite
from .rules import RewriteRules

__all__ = ["Match", "MatchFailure", "match", "Pattern", "moved", "op_pattern", "optional_cast", "pattern",
           "Rewrite", "RewriteRules", "apply", "try_rewrite"]
