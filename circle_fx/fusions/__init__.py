"""Fusion families (one module each) and their registry (:mod:`.registry`).

Every public module in this folder is a family and is imported here (``pkgutil``), so importing
:mod:`circle_fx.fusions` registers them all and a new family needs no hand-edited import list;
``_``-prefixed modules are a family's helpers. The order the fuse passes run in is each
family's own ``order`` (not the file names). A user family is registered the same way
(``register_family``).
"""
import importlib
import pkgutil

from .registry import (Candidate, FusionFamily, canonical_rules, composite_rules, families, get_family,
                       on_register, register_family, unregister_family)

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if not _m.startswith("_") and _m != "registry":
        importlib.import_module(f"{__name__}.{_m}")

__all__ = ["Candidate", "FusionFamily", "canonical_rules", "composite_rules", "families", "get_family",
           "on_register", "register_family", "unregister_family"]
