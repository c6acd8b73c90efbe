"""The pattern language: patterns (:mod:`.pattern`), matcher (:mod:`.matcher`) and rewrite
rules (:mod:`.rewrite`). The rules written in it live with their fusion family in
:mod:`circle_fx.fusions`."""
from .matcher import Match, MatchFailure, match
from .pattern import Pattern, moved, optional_cast, pattern
from .rewrite import Rewrite, apply, try_rewrite

__all__ = ["Match", "MatchFailure", "match", "Pattern", "moved", "optional_cast", "pattern",
           "Rewrite", "apply", "try_rewrite"]
