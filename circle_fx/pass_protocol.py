"""The pass protocol: a pass takes a :class:`~circle_fx.program.Program`, rewrites its
graph in place, and returns whether it changed anything.

Plain functions ``def my_pass(program) -> bool`` are passes too; :class:`Pass` only adds a
name (used in error messages and the summary) and a ``__call__`` that forwards to
``run``. Keeping the contract this small is what lets users drop their own passes into
the pipeline without subclassing anything.
"""
from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

from .program import Program


@runtime_checkable
class PassLike(Protocol):
    def __call__(self, program: Program) -> bool: ...


class Pass:
    """Base class for named passes. Subclasses implement :meth:`run`."""

    name: str = ""

    def __init__(self) -> None:
        if not self.name:
            self.name = type(self).__name__

    def run(self, program: Program) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, program: Program) -> bool:
        return bool(self.run(program))

    def __repr__(self) -> str:
        return f"<pass {self.name}>"


class NodePass(Pass):
    """A pass that visits each ``call_function`` node once, in graph order (a snapshot: nodes
    it adds are not visited, nodes it erases are skipped), and changed the graph when any
    :meth:`visit` did. Subclasses implement :meth:`visit`."""

    def visit(self, program: Program, node) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def run(self, program: Program) -> bool:
        changed = False
        for n in list(program.gm.graph.nodes):
            if n.op == "call_function" and not getattr(n, "_erased", False):
                changed |= bool(self.visit(program, n))
        return changed


def pass_name(p: Callable) -> str:
    return getattr(p, "name", None) or getattr(p, "__name__", None) or type(p).__name__
