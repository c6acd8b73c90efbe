"""The emitter: lowering registry, per-op lowerings, builder and writer.

Importing this package registers every built-in lowering (eagerly, once), so the registry
is complete before any user lowering is added and no lookup has to import on demand.
"""
from . import lowerings  # noqa: F401  (registers the built-in lowerings)
