"""Running Circle files in onert (ONE's on-device runtime), the reference executor.

onert picks its loader by file extension, so models are always run from a ``.circle``
path; ``USE_MMAPED_DATA=1`` makes it map weights instead of copying them.
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from ..errors import InputError, RuntimeFailure, VerifyError
from .fdcapture import FdCapture
from .ggml_support import check_ggml_runs, ggml_threads


def check_loadable(path: str) -> None:
    """``verify`` the file before onert sees it: onert 0.1.0 segfaults on a truncated or
    corrupt file (docs/onert-findings.md), which would kill the host process. Every place
    that hands a file to onert calls this first (OnertSession, the LLM runner). Then the
    valid files onert 0.1.0 cannot load either (:func:`check_onert_layout`)."""
    from .verify import verify

    try:
        verify(path)
    except VerifyError as e:
        raise VerifyError(f"refusing to load {path} into onert (a malformed file crashes it): {e}",
                          e.problems) from None
    check_onert_layout(path)


#: onert 0.1.0 maps a file with a 32-bit size: from 2 GiB on it fails ("mmap failed")
ONERT_FILE_LIMIT = 1 << 31

EXTERNAL_WHY = ("its weights are stored after the flatbuffer (Buffer.offset/size, the layout circle_fx "
                "writes past the 2 GB flatbuffer limit or with external_weights=True), which onert 0.1.0's "
                "loader does not read: it crashes the process in prepare() (docs/onert-findings.md section 2). "
                "The file is valid Circle; to run it in onert, quantize the weights (quantize='q4_0', "
                "'q8_0' or 'int8-weights') so that they fit inline")


def check_onert_layout(path: str) -> None:
    """Refuse, as :class:`RuntimeFailure`, a *valid* file onert 0.1.0 cannot load without
    crashing: one of 2 GiB or more, or one whose buffers live outside the flatbuffer. Call it
    on verified bytes only (the buffer table is read with the generated accessors)."""
    import mmap

    from circle_schema import circle

    size = os.path.getsize(path)
    if size >= ONERT_FILE_LIMIT:
        raise RuntimeFailure(f"onert 0.1.0 cannot run {path}: the file is {size / (1 << 30):.2f} GiB and onert "
                             f"maps files only below 2 GiB; {EXTERNAL_WHY}")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        model = circle.Model.Model.GetRootAs(mm, 0)
        external = sum(1 for i in range(model.BuffersLength()) if model.Buffers(i).Offset() > 1)
        del model  # the accessors hold views of the mapping: release them before it closes
    if external:
        raise RuntimeFailure(f"onert 0.1.0 cannot run {path}: {external} buffer(s) are external; {EXTERNAL_WHY}")


def _failure(what: str, err: Exception, printed: str) -> RuntimeFailure:
    """One error: onert's exception plus what onert printed on the C-level stdout/stderr."""
    text = f"{what}: {err}"
    if printed:
        text += "\n  onert printed:\n" + "\n".join("    " + line for line in printed.splitlines()[-20:])
    return RuntimeFailure(text)


def _replay(printed: str) -> None:
    """On success, onert's output (if any) is not swallowed: it goes to Python's stderr."""
    if printed:
        import sys

        print(printed, file=sys.stderr)


def check_index_range(name: str, values: np.ndarray, valid) -> None:
    """An input that indexes a table (token ids) must lie in ``valid = (lo, hi)``: onert's
    GATHER reads outside the table without an error (the file clamps by default, which is
    still a silently wrong answer), so out-of-range values are refused here, naming them."""
    if valid is None or values.size == 0:
        return
    lo, hi = valid
    bad = values[(values < lo) | (values > hi)]
    if bad.size:
        shown = ", ".join(str(int(v)) for v in np.unique(bad)[:8])
        raise InputError(f"input {name!r} has value(s) {shown} outside {lo}..{hi}, the rows of the table "
                         "it indexes (e.g. token ids past the vocabulary)")


class OnertSession:
    def __init__(self, path: str, verified: bool = False):
        """``verified``: the caller has already done :func:`check_loadable`'s work on these exact
        bytes (CircleModel.run: ``verify`` on its serialized model, and external weights refused)."""
        if not verified:
            check_loadable(path)
        os.environ.setdefault("USE_MMAPED_DATA", "1")
        try:
            import onert
        except ImportError as e:  # pragma: no cover - onert is a hard dependency
            raise RuntimeFailure("onert is not installed: pip install onert") from e
        # a CPU onert's ggml kernels cannot run on would SIGILL the process
        self._ggml = check_ggml_runs(path)
        self._capture = FdCapture()
        try:
            with self._capture:
                self.session = onert.infer.session(path)
        except Exception as e:
            raise _failure(f"onert could not load {path}", e, self._capture.text) from e
        _replay(self._capture.text)
        self.path = path

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        try:
            # the first run prepares the session: onert reads NUM_THREADS then
            with self._capture, ggml_threads(self._ggml and not getattr(self.session, "_prepared", False)):
                outs = self.session.infer([np.ascontiguousarray(x) for x in inputs])
        except Exception as e:
            raise _failure(f"onert failed to run {self.path}", e, self._capture.text) from e
        _replay(self._capture.text)
        return [np.asarray(o) for o in outs]


def temp_circle_path(prefix: str = "circle_fx_") -> str:
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".circle")
    os.close(fd)
    return path
