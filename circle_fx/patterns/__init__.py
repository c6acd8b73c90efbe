"""Pattern language (:mod:`.pattern`), matcher (:mod:`.matcher`), rewrite rules
(:mod:`.rewrite`) and the pattern library (:mod:`.rms_norm`)."""
from .matcher import Match, MatchFailure, match
from .pattern import Pattern, optional_cast, pattern
from .rewrite import Rewrite, apply, try_rewrite

__all__ = ["Match", "MatchFailure", "match", "Pattern", "optional_cast", "pattern",
           "Rewrite", "apply", "try_rewrite"]
