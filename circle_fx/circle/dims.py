"""Dims algebra shared by lowering, legalization and verification: one convention, pure.

A shape is a ``list[int]`` with :data:`DYNAMIC` (-1, exactly Circle's ``shape_signature``)
for a size known only at run time; emit, the legalization steps and ``verify`` all read dims
this way, so no code translates between conventions.

Several onert 0.1.0 kernels are correct only up to some rank (``circle/limits.py``). The one
rank-lowering move is :func:`runs` + :func:`fold`: neighbouring positions that behave alike
(all reduced or all kept, all broadcast the same way...) are multiplied into one dim. Row-major
order is unchanged, so the RESHAPEs in and out are exact.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence

#: a dim whose size is known only at run time
DYNAMIC = -1


def numel(dims: Iterable[int]) -> int:
    """Product of ``dims``; :data:`DYNAMIC` when any of them is. (Symbolic sizes, e.g. torch
    SymInts in a decomposition, multiply symbolically: no comparison guards them.)"""
    dims = list(dims)
    return DYNAMIC if any(isinstance(d, int) and d == DYNAMIC for d in dims) else math.prod(dims)


def same(a: int, b: int) -> bool:
    """Whether two dims can be equal (a dynamic dim matches anything)."""
    return a == DYNAMIC or b == DYNAMIC or a == b


def same_shape(a: Sequence[int], b: Sequence[int]) -> bool:
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def fmt(dims: Sequence[int]) -> str:
    """``[2, ?, 4]``: dims for a message."""
    return "[" + ", ".join("?" if d == DYNAMIC else str(d) for d in dims) + "]"


def padded(dims: Sequence[int], rank: int, fill: int = 1) -> list[int]:
    """``dims`` right-aligned to ``rank`` (numpy broadcasting's view of a lower rank)."""
    return [fill] * (rank - len(dims)) + list(dims)


def broadcast(*shapes: Sequence[int]) -> list[int]:
    """The numpy-broadcast of ``shapes`` (right-aligned). A static size other than 1 wins; a
    dynamic dim against only 1s stays dynamic. Raises ``ValueError`` naming the first
    position whose static sizes differ."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        col = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]
        known = {d for d in col if d not in (1, DYNAMIC)}
        if len(known) > 1:
            raise ValueError(f"shapes {', '.join(fmt(s) for s in shapes)} do not broadcast (dim {k})")
        out.append(known.pop() if known else DYNAMIC if DYNAMIC in col else 1)
    return out


def runs(keys: Sequence[Hashable], skip: Callable[[int], bool] = lambda k: False) -> list[tuple[Hashable, list[int]]]:
    """Positions grouped into runs of neighbours with equal ``keys[k]``: ``[(key, positions)]``.
    Positions where ``skip(k)`` holds (typically a size-1 dim, which folds into anything) are
    left out and do not break a run."""
    out: list[tuple[Hashable, list[int]]] = []
    for k, key in enumerate(keys):
        if skip(k):
            continue
        if out and out[-1][0] == key:
            out[-1][1].append(k)
        else:
            out.append((key, [k]))
    return out


def fold(dims: Sequence[int], groups: Sequence[tuple[Hashable, list[int]]]) -> list[int]:
    """``dims`` with each run of :func:`runs` multiplied into one dim (``[1]`` when none)."""
    return [numel(dims[k] for k in ks) for _, ks in groups] or [1]


def around(dims: Sequence[int], axis: int) -> list[int]:
    """``[prod(before axis), dims[axis], prod(after axis)]``: any rank as rank 3 for an
    operation along one axis."""
    return [numel(dims[:axis]), dims[axis], numel(dims[axis + 1:])]
