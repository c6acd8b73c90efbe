"""Capturing what native code prints, at the file-descriptor level.

onert reports problems by printing to the process's C-level stdout/stderr (e.g. "Error
during nnfw_session::input_tensorinfo : Error: Model has type that runtime API does not
support.") and then raising a terse Python exception. ``sys.stdout`` redirection cannot
see those writes, so fds 1 and 2 are pointed at a temp file around each onert call and
the text is handed back, to be folded into :class:`~circle_fx.errors.RuntimeFailure`.

The redirect is process-wide for the duration of the call: another thread printing at
that moment would be captured too (and re-emitted on stderr on success, so not lost).
"""
from __future__ import annotations

import ctypes
import os
import sys
import tempfile

try:
    _libc = ctypes.CDLL(None)
except OSError:  # pragma: no cover - no C library to flush
    _libc = None


def _flush_c() -> None:
    if _libc is not None:
        _libc.fflush(None)  # C stdio buffers (C++ iostreams sync into them) go to the temp file


class FdCapture:
    """Reusable: ``with cap: ...`` then ``cap.text`` holds what fds 1 and 2 received."""

    def __init__(self):
        self._file = tempfile.TemporaryFile()
        self.text = ""

    def __enter__(self) -> "FdCapture":
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or odd stream: nothing to flush
                pass
        self._file.seek(0)
        self._file.truncate()
        self._saved = (os.dup(1), os.dup(2))
        os.dup2(self._file.fileno(), 1)
        os.dup2(self._file.fileno(), 2)
        return self

    def __exit__(self, *exc) -> None:
        _flush_c()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        self._file.seek(0)
        self.text = self._file.read().decode(errors="replace").strip()

    def close(self) -> None:
        self._file.close()
