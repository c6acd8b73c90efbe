"""Running Circle files in onert (ONE's on-device runtime), the reference executor.

onert picks its loader by file extension, so models are always run from a ``.circle``
path; ``USE_MMAPED_DATA=1`` makes it map weights instead of copying them.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from ..errors import RuntimeFailure


class OnertSession:
    def __init__(self, path: str):
        os.environ.setdefault("USE_MMAPED_DATA", "1")
        try:
            import onert
        except ImportError as e:  # pragma: no cover - onert is a hard dependency
            raise RuntimeFailure("onert is not installed: pip install onert") from e
        try:
            self.session = onert.infer.session(path)
        except Exception as e:
            raise RuntimeFailure(f"onert could not load {path}: {e}") from e
        self.path = path

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        try:
            outs = self.session.infer([np.ascontiguousarray(x) for x in inputs])
        except Exception as e:
            raise RuntimeFailure(f"onert failed to run {self.path}: {e}") from e
        return [np.asarray(o) for o in outs]


def temp_circle_path(prefix: str = "circle_fx_") -> str:
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".circle")
    os.close(fd)
    return path
