"""Checking where a model will be written *before* spending time converting it.

``CircleModel.save`` and ``circle-fx export -o`` call :func:`check_output_path` first, so a
typo in a directory name costs nothing and the error names the path the user gave (the
atomic write goes through a temp file next to it, whose name must never surface).

Permissions follow ``os.access`` semantics: for root, mode bits do not stop a write, so a
0555 directory or a 0444 file is writable for root and is not refused; a read-only file
system is. Whatever the check cannot foresee (a full disk, a file system that refuses new
files) still fails in ``save`` with an :class:`~circle_fx.errors.OutputError` naming the path.
"""
from __future__ import annotations

import os

from .errors import OutputError


def check_output_path(path: str | os.PathLike) -> str:
    """Return ``path`` as a string, or raise :class:`OutputError` saying why it cannot be written."""
    try:
        path = os.fspath(path)
    except TypeError:
        raise OutputError(f"output path must be a str or os.PathLike, got {type(path).__name__}") from None
    if not path:
        raise OutputError("output path is empty")
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise OutputError(f"{path}: is a directory; give a file name, e.g. {os.path.join(path, 'model.circle')}")
    parent = os.path.dirname(full)
    if not os.path.isdir(parent):
        existing = parent
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            raise OutputError(f"{path}: {existing} is a file, not a directory")
        raise OutputError(f"{path}: directory {os.path.dirname(path) or parent} does not exist")
    if os.path.exists(full) and not os.access(full, os.W_OK):
        raise OutputError(f"{path}: the file exists and is read-only")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{path}: no permission to create files in directory {parent}")
    return path
