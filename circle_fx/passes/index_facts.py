"""The ``index_facts`` analysis: what dataflow says about each indexing node's operands,
recorded in ``node.meta[INDEX_FACTS]`` (:class:`circle_fx.meta.IndexFacts`) for its lowering
(:mod:`circle_fx.emit.lowerings.gather`), which then only reads it.

Two analyses, each following values back through the ops that move them:

- *repeated dims* (:func:`repeated_dims`): dims of the indexed tensor along which every slice
  is equal — static size-1 dims, dims an ``expand`` repeated, carried through elementwise
  ops with scalars and along-one-dim ops (slice, cumsum, diff break equality only along their
  own dim). An index tensor on such a dim selects nothing; transformers' mask functions index
  ``positions[batch_idx, kv_idx]`` with ``positions = arange(S).expand(B, -1)``, and dropping
  ``batch_idx`` leaves one index tensor (GATHER).
- *positions* (:func:`never_negative`, :func:`counts_positions`): an index tensor whose values
  are positions (``topk``/``sort``/``max.dim`` indices, ``argmax``, ``arange`` from a start
  >= 0, moved around) is never negative, so no wrap ``idx + size * (idx < 0)`` is emitted for
  it (the MoE router case); an int64 table of positions or counts (``arange``, a ``cumsum`` of
  bools) fits int32, which onert's GATHER takes.

The pass runs last in ``finalize_pipeline``, after every rewrite, so the facts describe the
graph the emitter lowers. It changes no node. O(indexing nodes x the chains behind them).
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..fx_utils import dtype_of, look_through, same_size, val
from ..meta import INDEX_FACTS, IndexFacts
from ..op_traits import ARANGE, ELEMENTWISE, EXPAND, IDENTITY, POSITION, VALUE_PRESERVING
from ..pass_protocol import Pass

aten = torch.ops.aten


class AnalyzeIndexing(Pass):
    name = "index_facts"

    def run(self, program) -> bool:
        for n in program.gm.graph.nodes:
            if n.op == "call_function" and n.target is aten.index.Tensor:
                n.meta[INDEX_FACTS] = facts(n)
        return False  # an analysis: the graph is unchanged


def facts(n: fx.Node) -> IndexFacts:
    x, indices = n.args[0], n.args[1]
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    return IndexFacts(
        repeated_dims=frozenset(repeated_dims(x)) if len(given) > 1 else frozenset(),
        table_counts_positions=dtype_of(x) == torch.int64 and counts_positions(x),
        never_negative=frozenset(d for d, i in given if isinstance(i, fx.Node) and never_negative(i)))


def repeated_dims(n) -> set:
    """Dims of ``n`` along which all slices are equal: static size-1 dims, dims an ``expand``
    repeated, carried through elementwise ops with scalars and along-one-dim ops
    (slice, cumsum, diff, which may break equality only along their own dim)."""
    v = val(n)
    if not isinstance(v, torch.Tensor):
        return set()
    rank = v.dim()
    ones = {d for d, s in enumerate(v.shape) if same_size(s, 1)}
    if not isinstance(n, torch.fx.Node) or n.op != "call_function":
        return ones
    args = n.args
    if n.target in EXPAND:
        src = val(args[0])
        lead = rank - src.dim()
        inner = repeated_dims(args[0])
        return ones | set(range(lead)) | {d + lead for d, s in enumerate(src.shape) if same_size(s, 1)} \
            | {d + lead for d in inner}
    tensors = [a for a in args if isinstance(a, torch.fx.Node) and isinstance(val(a), torch.Tensor)]
    if (n.target in ELEMENTWISE or n.target in IDENTITY) and len(tensors) == 1 and val(tensors[0]).dim() == rank:
        return ones | repeated_dims(tensors[0])
    if n.target in (aten.cumsum.default, aten.slice.Tensor) and val(args[0]).dim() == rank:
        return ones | (repeated_dims(args[0]) - {args[1] % rank})
    if n.target == aten.diff.default:
        dim = (args[2] if len(args) > 2 else -1) % rank
        parts = [a for a in args[3:] if isinstance(a, torch.fx.Node)] + [args[0]]
        if all(val(p).dim() == rank for p in parts):
            return ones | (set.intersection(*(repeated_dims(p) for p in parts)) - {dim})
    return ones


def _source(idx):
    """``idx`` with value-preserving moves (views, expands, slices) looked through."""
    idx = look_through(idx)
    while idx.op == "call_function" and idx.target in VALUE_PRESERVING:
        idx = look_through(idx.args[0])
    return idx


def _first_position(idx) -> int | None:
    """The first value when ``idx`` is ``arange(start, ...)`` (+ constants) moved around, else None.
    Its values are then ``first .. first + size - 1``."""
    idx = _source(idx)
    if idx.op == "call_function" and idx.target in ARANGE:
        start = 0 if idx.target == aten.arange.default else idx.args[0]
        step = idx.args[2] if idx.target == aten.arange.start_step else 1
        return start if isinstance(start, int) and step == 1 else None
    if idx.op == "call_function" and idx.target == aten.add.Tensor and isinstance(idx.args[1], int):
        first = _first_position(idx.args[0])
        return None if first is None else first + idx.args[1]
    return None


def counts_positions(x) -> bool:
    """``x`` holds positions or counts, so it fits int32: ``arange`` (+ constants) from a
    small start (its length is a dim's size, bounded by the dim's max), or the ``cumsum``
    of a bool tensor, moved around."""
    first = _first_position(x)
    if first is not None:
        return abs(first) < 2**30
    x = _source(x)
    return (x.op == "call_function" and x.target == aten.cumsum.default
            and val(x.args[0]).dtype == torch.bool)


def never_negative(idx) -> bool:
    first = _first_position(idx)
    if first is not None:
        return first >= 0
    idx = _source(idx)
    if idx.op == "call_function" and idx.target is operator.getitem:
        src, i = idx.args
        return (getattr(src, "target", None), i) in POSITION
    return (getattr(idx, "target", None), None) in POSITION
