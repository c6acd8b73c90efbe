"""Matching one :class:`Pattern` at one root node of a target graph.

The walk starts at the pattern's root and the candidate root and follows inputs
backwards, so an attempt costs O(pattern size x 2^commutative ops) no matter how big the
graph is; a pass that tries every node is therefore linear in graph size.

Matching rules:
- ``aten.add.Tensor`` / ``aten.mul.Tensor`` operands match in either order;
- no-op nodes in the target (same-dtype casts, ``alias``, ``clone``) are seen through
  and become part of the match;
- a :func:`~.pattern.moved` marker matches any chain of data-movement ops (longest first),
  covered by the match;
- every matched node except the root must have no users outside the match, otherwise
  replacing the root would leave a second copy of the computation alive.

A failed attempt returns a :class:`MatchFailure` with the reason found at the deepest
point reached; ``explain`` shows these to users whose norm did not fuse.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.fx as fx

from ..fx_utils import arguments, is_noop, look_through
from ..op_traits import CAST, COMMUTATIVE, MOVEMENT
from ..source import describe, op_name, source_line
from .pattern import Pattern, moved, optional_cast

aten = torch.ops.aten


@dataclass
class Match:
    pattern: Pattern
    root: fx.Node
    bindings: dict[str, Any]
    #: every target node the match covers, root included (no-ops seen through too)
    nodes: list[fx.Node]

    def __getitem__(self, name: str) -> Any:
        return self.bindings[name]


@dataclass
class MatchFailure:
    pattern: Pattern
    root: fx.Node
    #: a string, or a zero-argument callable producing it (formatting is deferred
    #: because most failed attempts are never shown and source lookups are not free)
    why: Any
    at: fx.Node | None = None
    progress: int = 0
    nodes: list[fx.Node] = field(default_factory=list)
    #: name of the rule check that rejected a complete structural match (None when the
    #: graph itself did not match)
    check: str | None = None

    def __bool__(self) -> bool:
        return False

    @property
    def reason(self) -> str:
        if callable(self.why):
            self.why = self.why()
        return self.why

    def describe(self) -> str:
        where = f" at {source_line(self.at)}" if self.at is not None else ""
        return f"{self.pattern.name}: {self.reason}{where}"


@dataclass
class _State:
    bindings: dict
    mapping: dict  # pattern node -> target node
    covered: list

    def fork(self) -> "_State":
        return _State(dict(self.bindings), dict(self.mapping), list(self.covered))


class _Attempt:
    def __init__(self, pattern: Pattern, root: fx.Node):
        self.pattern = pattern
        self.root = root
        self.best: MatchFailure | None = None

    def fail(self, st: _State, why, at, complete: bool = False) -> None:
        # a complete structural match that failed later (a leak) outranks every partial one;
        # among equals the first wins, i.e. operands in the order the user wrote them
        progress = len(st.mapping) + (1 if complete else 0)
        if self.best is None or progress > self.best.progress:
            self.best = MatchFailure(self.pattern, self.root, why,
                                     at if isinstance(at, fx.Node) else None, progress, list(st.covered))

    def value(self, p: Any, t: Any, st: _State) -> Iterator[_State]:
        if not isinstance(p, fx.Node):
            yield from self.literal(p, t, st)
        elif p.op == "placeholder":
            yield from self.wildcard(p, t, st)
        elif p.target is optional_cast:
            yield from self.maybe_cast(p, t, st)
        elif p.target is moved:
            yield from self.movement(p, t, st)
        else:
            yield from self.op(p, t, st)

    def literal(self, p, t, st):
        if isinstance(p, (list, tuple)) and isinstance(t, (list, tuple)) and len(p) == len(t):
            states = [st]
            for pi, ti in zip(p, t):
                states = [s2 for s in states for s2 in self.value(pi, ti, s)]
            yield from states
        elif not isinstance(t, fx.Node) and _same_literal(p, t):
            yield st
        else:
            self.fail(st, lambda: f"found {_show(t)} where the pattern has {p!r}", t)

    def wildcard(self, p, t, st):
        t = look_through(t)
        name = p.target
        if name in st.bindings:
            bound = st.bindings[name]
            same = bound is t if isinstance(bound, fx.Node) or isinstance(t, fx.Node) else _same_literal(bound, t)
            if not same:
                self.fail(st, lambda: f"'{name}' must be one value, but found {_show(bound)} and {_show(t)}", t)
                return
            yield st
            return
        st = st.fork()
        st.bindings[name] = t
        yield st

    def maybe_cast(self, p, t, st):
        inner = look_through(t)
        if isinstance(inner, fx.Node) and inner.op == "call_function" and inner.target in CAST:
            st2 = st.fork()
            st2.covered.extend(_chain(t, inner))
            yield from self.value(p.args[0], inner.args[0], st2)
        yield from self.value(p.args[0], t, st)

    def movement(self, p, t, st):
        ends, covered = [(t, [])], []
        while True:
            inner = look_through(ends[-1][0])
            if not (isinstance(inner, fx.Node) and inner.op == "call_function" and inner.target in MOVEMENT):
                break
            covered = covered + _chain(ends[-1][0], inner)
            ends.append((inner.args[0], covered))
        for end, chain in reversed(ends):  # the longest chain first
            st2 = st.fork()
            st2.covered.extend(chain)
            yield from self.value(p.args[0], end, st2)

    def op(self, p, t, st):
        tt = look_through(t)
        if p in st.mapping:
            if st.mapping[p] is tt:
                yield st
            else:
                self.fail(st, lambda: f"expected the same {op_name(p.target)} node twice, found {_show(tt)}", tt)
            return
        if not isinstance(tt, fx.Node) or tt.op != "call_function" or tt.target != p.target:
            self.fail(st, lambda: f"expected {op_name(p.target)}, found {_show(tt)}", tt)
            return
        st = st.fork()
        st.mapping[p] = tt
        st.covered.extend(_chain(t, tt))
        pa, ta = arguments(p), arguments(tt)
        if len(pa) != len(ta):
            self.fail(st, lambda: f"{describe(tt)} has {len(ta)} arguments, pattern has {len(pa)}", tt)
            return
        orders = [ta]
        if p.target in COMMUTATIVE:
            orders.append([ta[1], ta[0]] + list(ta[2:]))
        for order in orders:
            states = [st]
            for pi, ti in zip(pa, order):
                states = [s2 for s in states for s2 in self.value(pi, ti, s)]
                if not states:
                    break
            yield from states


def _chain(t, end) -> list[fx.Node]:
    """Nodes from ``t`` back to ``end`` along no-op links (inclusive)."""
    out = []
    while isinstance(t, fx.Node):
        out.append(t)
        if t is end or not is_noop(t):
            break
        t = t.args[0]
    return out


def _same_literal(a, b) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same_literal(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (type(a) is type(b) and a == b)
    try:
        return a == b
    except Exception:
        return False


def _show(v) -> str:
    return describe(v) if isinstance(v, fx.Node) else repr(v)


def match(pattern: Pattern, root: fx.Node) -> Match | MatchFailure:
    """Match ``pattern`` with its root at ``root``. Checks outside users too."""
    attempt = _Attempt(pattern, root)
    for st in attempt.value(pattern.root, root, _State({}, {}, [])):
        covered = list(dict.fromkeys(st.covered))
        inside = set(covered)
        leak = None
        for n in covered:
            if n is root:
                continue
            for user in n.users:
                if user not in inside:
                    leak = (n, user)
                    break
            if leak:
                break
        if leak is None:
            return Match(pattern, root, st.bindings, covered)
        n, user = leak
        attempt.fail(st, lambda n=n, user=user: f"%{n.name} is also used outside the pattern by {describe(user)}", n,
                     complete=True)
    # MatchFailure is falsy, so `best or ...` would always discard the recorded failure
    return attempt.best if attempt.best is not None else MatchFailure(pattern, root, "no match")
