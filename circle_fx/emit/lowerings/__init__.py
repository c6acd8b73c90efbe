"""Built-in lowerings, one module per kind of op; importing this package registers them all.

Every public module in this folder is imported (``pkgutil``), so a new lowering file needs
no hand-edited import list; ``_``-prefixed modules are shared helpers.
"""
import importlib
import pkgutil

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if not _m.startswith("_"):
        importlib.import_module(f"{__name__}.{_m}")
