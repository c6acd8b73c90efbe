"""Quiet command-line tools: import the libraries that print on import, with their noise dropped.

transformers imports torchao whenever it is installed (its quantizer registry), and torchao's
import prints "Failed to load ... .so" for CUDA-only extensions and torch's ``_pytree``
deprecation warnings, on every run, although nothing is quantized. Those lines are no message
for a user of ``make demo`` or ``circle-fx``: the tools import torchao once up front with fds 1
and 2 captured (C-level prints included) and discard what it printed. The library API does not
call this: a Python caller keeps its own process's output as it is.
"""
from __future__ import annotations

import importlib.util
import sys

NOISY = ("torchao", "torchao.prototype.mx_formats.config")  # the second registers one more pytree enum


def preload_noisy_libraries() -> None:
    """Import each installed library of ``NOISY`` not imported yet, dropping what it prints."""
    from .circle.fdcapture import FdCapture

    for name in NOISY:
        # find_spec of a submodule would import its parents outside the capture: ask for the top one
        if name in sys.modules or importlib.util.find_spec(name.partition(".")[0]) is None:
            continue
        with FdCapture():
            try:
                __import__(name)
            except Exception:  # a broken install: the code that really needs it reports it
                pass
