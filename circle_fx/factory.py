"""``MODULE:FACTORY`` -> the factory callable: how every command line names a model.

Its own module (not ``cli.py``) because both ``circle_fx.cli`` and ``circle_fx.llm.cli`` use
it, and ``cli.py`` registers ``llm.cli``'s commands: one of them importing the other would
be a cycle.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys

from .errors import InputError


def load_factory(spec: str):
    """Resolve ``MODULE:FACTORY`` to the factory callable (``InputError`` if it cannot)."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise InputError(f"expected MODULE:FACTORY (e.g. my_models.py:build or circle_fx.demo:tiny_llama), got {spec!r}")
    if module_name.endswith(".py") or os.sep in module_name or "/" in module_name:
        module = _import_path(module_name)
    else:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and module_name.startswith(e.name):  # the module itself, not one it imports
                raise InputError(f"no module named {module_name!r} (for a file, give its path ending in .py)") from e
            raise InputError(f"importing {module_name!r} failed: {type(e).__name__}: {e}") from e
        except Exception as e:
            raise InputError(f"importing {module_name!r} failed: {type(e).__name__}: {e}") from e
    factory = module
    for part in attr.split("."):
        if not hasattr(factory, part):
            raise InputError(f"{module_name!r} has no attribute {attr!r}")
        factory = getattr(factory, part)
    if not callable(factory):
        raise InputError(f"{spec}: {attr!r} is not callable (got {type(factory).__name__})")
    return factory


def _import_path(path: str):
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    name = "_circle_fx_user_" + "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InputError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # the file's own directory on sys.path, as `python file.py` would have it, for sibling imports
    directory = os.path.dirname(os.path.abspath(path))
    added = directory not in sys.path
    if added:
        sys.path.insert(0, directory)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise InputError(f"importing {path} failed: {type(e).__name__}: {e}") from e
    finally:
        if added:
            sys.path.remove(directory)
    return module
