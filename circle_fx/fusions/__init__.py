"""Fusion families (one module each) and their registry (:mod:`.registry`).

Built-in families are imported here, eagerly, so importing :mod:`circle_fx.fusions`
registers them; a user family is registered the same way (``register_family``).
"""
from .registry import Candidate, FusionFamily, composite_rules, families, get_family, register_family, unregister_family
from . import rms_norm  # noqa: F401  (registers the RMSNorm family)
from . import rope  # noqa: F401  (registers the RoPE family: circle.rope -> ROPE, single position only)

__all__ = ["Candidate", "FusionFamily", "composite_rules", "families", "get_family", "register_family",
           "unregister_family"]
