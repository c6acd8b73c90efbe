"""Running pass lists, and the :class:`Pipeline` users edit to register their own passes.

Each pass runs once, in order; after each one the graph is linted and, if the pass broke
it (or raised), a :class:`~circle_fx.errors.PassError` names the pass. That check is what
makes it safe to accept arbitrary user passes.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable

from ..errors import CircleFxError, PassError
from ..program import Program
from ..pass_protocol import pass_name
from .validate import check_meta, is_builtin_pass


class Pipeline(list):
    """An ordered, editable list of passes (a ``list`` with name-based helpers).

    >>> pipe = circle_fx.default_pipeline()
    >>> pipe.insert_after("fuse_rms_norm", my_pass)
    """

    def index_of(self, name: str) -> int:
        for i, p in enumerate(self):
            if pass_name(p) == name:
                return i
        raise KeyError(f"no pass named {name!r} in pipeline {self.names()}")

    def names(self) -> list[str]:
        return [pass_name(p) for p in self]

    def insert_after(self, name: str, p: Callable) -> "Pipeline":
        self.insert(self.index_of(name) + 1, p)
        return self

    def insert_before(self, name: str, p: Callable) -> "Pipeline":
        self.insert(self.index_of(name), p)
        return self

    def replace(self, name: str, p: Callable) -> "Pipeline":
        self[self.index_of(name)] = p
        return self

    def remove_pass(self, name: str) -> "Pipeline":
        del self[self.index_of(name)]
        return self


def run_passes(program: Program, passes: Iterable[Callable], timings: dict | None = None) -> bool:
    """Run ``passes`` over ``program`` in order; return whether any changed the graph.

    The checks after each pass (lint, outputs, meta) are O(nodes), so a pipeline costs
    O(passes x nodes) on top of the passes' own (linear) work.
    """
    changed = False
    for p in passes:
        name = pass_name(p)
        if not callable(p):
            raise PassError(f"pass {name!r} is not callable (got {type(p).__name__})")
        start = time.perf_counter()
        before = set(program.gm.graph.nodes)
        try:
            result = p(program)
        except CircleFxError:
            raise
        except Exception as e:
            raise PassError(f"pass {name!r} raised {type(e).__name__}: {e}") from e
        try:
            program.gm.graph.lint()
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise PassError(f"pass {name!r} left the graph invalid: {first}") from e
        _check_outputs(program, name)
        check_meta(program, name, before, deep=not is_builtin_pass(p))
        if timings is not None:
            timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
        changed |= bool(result)
    program.gm.recompile()
    return changed


def _check_outputs(program: Program, name: str) -> None:
    outs = program.gm.graph.output_node().args[0]
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    if len(outs) != len(program.output_names):
        raise PassError(
            f"pass {name!r} changed the number of graph outputs "
            f"from {len(program.output_names)} to {len(outs)}"
        )
    placeholders = [n.name for n in program.gm.graph.nodes if n.op == "placeholder"]
    if placeholders != program.input_names:
        raise PassError(f"pass {name!r} changed the graph inputs {program.input_names} -> {placeholders}")
