"""The conversion progress bar: drawn only on a TTY, never with verbose=False, cheap."""
from __future__ import annotations

import io
import sys

import pytest
import torch

import circle_fx
from circle_fx.progress import NullProgress, Progress, progress_for


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _export_with_stderr(stream, **kw):
    old = sys.stderr
    sys.stderr = stream
    try:
        return circle_fx.export(Net().eval(), (torch.randn(2, 16),), **kw)
    finally:
        sys.stderr = old


def test_bar_on_a_tty_with_verbose_true():
    err = FakeTTY()
    _export_with_stderr(err, verbose=True)
    out = err.getvalue()
    assert "circle_fx passes" in out and "circle_fx emit" in out
    assert "circle_fx: export" in out  # the stage timing line


@pytest.mark.parametrize("verbose", [False, None])
def test_silent_when_verbose_false_or_short_default(verbose):
    err = FakeTTY()
    _export_with_stderr(err, verbose=verbose)
    if verbose is False:
        assert err.getvalue() == ""
    else:  # default: the bar waits DELAY seconds before it appears; no timing line
        assert "circle_fx: export" not in err.getvalue()


def test_no_bar_when_not_a_tty():
    err = io.StringIO()  # isatty() is False, like a log file or CI
    _export_with_stderr(err, verbose=True)
    out = err.getvalue()
    assert "%|" not in out and "step" not in out  # no tqdm bar
    assert out.startswith("circle_fx: export")  # the timing line is plain text


def test_progress_for_picks_the_null_object():
    assert isinstance(progress_for(False, FakeTTY()), NullProgress)
    assert not progress_for(True, io.StringIO()).enabled
    bar = progress_for(True, FakeTTY())
    assert isinstance(bar, Progress) and bar.enabled
    bar.close()


class CountingTTY(FakeTTY):
    def __init__(self):
        super().__init__()
        self.writes = 0

    def write(self, s):
        self.writes += 1
        return super().write(s)


def test_ticks_do_not_redraw_the_bar_each_time():
    """One update per node stays cheap because tqdm redraws at most every ``mininterval``,
    not per tick. (How many microseconds a tick costs is a benchmark question: a wall-clock
    bound in a unit test fails on a loaded machine.)"""
    n = 20000
    stream = CountingTTY()
    bar = Progress(stream, delay=0.0)
    bar.stage("emit", n)
    before = stream.writes
    for _ in range(n):
        bar.update()
    redraws = stream.writes - before
    bar.close()
    assert redraws < n // 100, f"{redraws} writes for {n} updates"


def test_delay_holds_across_stages_and_visible_bar_is_cleared():
    quiet = FakeTTY()
    bar = Progress(quiet, delay=60.0)  # a short conversion: never reaches the delay
    for stage in ("torch.export", "passes", "emit"):
        bar.stage(stage, 3)
        bar.update(3)
    bar.close()
    assert quiet.getvalue() == ""

    shown = FakeTTY()
    bar = Progress(shown, delay=0.0)
    bar.stage("passes", 2)
    bar.update(2)
    bar.stage("emit", 5)
    bar.close()
    out = shown.getvalue()
    assert "circle_fx passes" in out and "circle_fx emit" in out
    assert out.rstrip(" ").endswith("\r")  # close() blanked the line (leave=False)
