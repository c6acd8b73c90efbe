"""Progress reporting for long conversions: one tqdm bar on a terminal, nothing otherwise.

``export(..., verbose=None)`` (the default) shows the bar only when stderr is a TTY and
the conversion has already taken :data:`DELAY` seconds, so small models and scripts stay
quiet; ``verbose=True`` also prints one line of stage timings to stderr (even when not a
TTY, where the bar itself stays off, since a bar in a log file is noise);
``verbose=False`` prints nothing at all.

The bar counts steps: one per pass, one per FX node lowered, so its cost is one
``update`` call per node. When off, a :class:`NullProgress` with empty methods stands in,
so callers never branch on it.
"""
from __future__ import annotations

import sys
import time
from typing import Optional

#: seconds a conversion must run before the bar appears (tqdm's ``delay``)
DELAY = 1.0


class NullProgress:
    """The progress API doing nothing: what non-interactive runs get."""

    enabled = False

    def stage(self, name: str, total: int) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Progress(NullProgress):
    """A tqdm bar that is reset for each stage ("passes", "emit") of one conversion."""

    enabled = True

    def __init__(self, stream=None, delay: float = DELAY):
        from tqdm.auto import tqdm

        self._bar = tqdm(total=0, desc="circle_fx", unit="step", file=stream or sys.stderr,
                         delay=delay, leave=False, dynamic_ncols=True)
        self._shown_after = time.monotonic() + delay

    def stage(self, name: str, total: int) -> None:
        bar = self._bar
        bar.set_description(f"circle_fx {name}", refresh=False)
        if time.monotonic() >= self._shown_after:
            bar.reset(total=total)  # visible: restart the counts and redraw
        else:  # tqdm's reset() would draw now; keep quiet until the delay has passed
            bar.total, bar.n, bar.last_print_n = total, 0, 0

    def update(self, n: int = 1) -> None:
        self._bar.update(n)

    def close(self) -> None:
        if time.monotonic() >= self._shown_after:
            self._bar.delay = 0  # after a reset() tqdm would think it never drew, and not clear the line
        self._bar.close()


def is_interactive(stream=None) -> bool:
    stream = stream or sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


def progress_for(verbose: Optional[bool], stream=None) -> NullProgress:
    """The bar for a conversion: off for ``verbose=False`` and whenever not on a TTY."""
    if verbose is False or not is_interactive(stream):
        return NullProgress()
    try:
        return Progress(stream, delay=0.0 if verbose else DELAY)
    except ImportError:  # tqdm is a dependency, but a missing bar must not fail an export
        return NullProgress()


def print_timings(timings: dict, stream=None) -> None:
    """One line of stage timings, for ``verbose=True``."""
    stream = stream or sys.stderr
    parts = ", ".join(f"{k} {v:.2f}s" for k, v in timings.items())
    print(f"circle_fx: {parts}, total {sum(timings.values()):.2f}s", file=stream)
