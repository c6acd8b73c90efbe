"""Advanced indexing with several index tensors -> one flat index (GATHER, not GATHER_ND).

``x[i, j]`` (``aten.index.Tensor`` with index tensors at several dims) would be GATHER_ND,
which onert 0.1.0 does not have. transformers produces it for every padded batch:
``create_causal_mask`` reads the 2-D ``attention_mask`` as ``mask[batch_idx, kv_idx]``.

The rewrite is exact and general: the indexed dims (made adjacent by a permute if they
are not, which is also where torch puts the broadcast index shape then: first) are merged
by a reshape, and the index tensors are combined into one row-major flat index
``((i0 * d1) + i1) * d2 + i2 ...`` (each wrapped first when negative, as torch counts from
the end). What is left, ``reshaped[..., flat, ...]``, is single-tensor indexing, i.e. one
GATHER. Constant index tensors (the mask case) fold to one constant index at compile
time; run-time index tensors cost a few integer ops.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from ..fx_utils import dtype_of, make_node, static_shape
from ..patterns import Match, Rewrite, op_pattern

aten = torch.ops.aten


def _wrapped(g: fx.Graph, i: fx.Node, size: int, like: fx.Node) -> fx.Node:
    """``i + size * (i < 0)``: no SELECT_V2 (onert has no int64 kernel for it)."""
    negative = make_node(g, aten.lt.Scalar, (i, 0), like=like)
    as_int = make_node(g, aten._to_copy.default, (negative,), {"dtype": dtype_of(i)}, like=like)
    offset = make_node(g, aten.mul.Tensor, (as_int, size), like=like)
    return make_node(g, aten.add.Tensor, (i, offset), like=like)


def _given(n: fx.Node) -> list[int]:
    return [d for d, i in enumerate(n.args[1]) if i is not None]


def several_index_tensors(m: Match) -> str | None:
    """The rule's form: index tensors at two dims or more (one is a GATHER as it is)."""
    return None if len(_given(m.root)) >= 2 else "one index tensor: a GATHER as it is"


def static_source(m: Match) -> str | None:
    if static_shape(m.root.args[0]) is None:
        return f"%{m.root.args[0].name}'s shape is symbolic, so its dims cannot be merged into one"
    return None


def integer_indices(m: Match) -> str | None:
    indices = m.root.args[1]
    if any(dtype_of(indices[d]) in (None, torch.bool, torch.uint8) for d in _given(m.root)):
        return "a boolean mask selects a data-dependent number of elements"
    return None


def flat_index(m: Match, g: fx.Graph) -> fx.Node:
    """The replacement: a reshape merging the indexed dims and one flat index tensor."""
    n = m.root
    x, indices = n.args[0], list(n.args[1])
    given = _given(n)
    shape = static_shape(x)
    k = len(given)
    if given == list(range(given[0], given[0] + k)):
        first, src, dims = given[0], x, list(shape)
    else:  # torch puts the broadcast index dims first when the indexed dims are not adjacent
        perm = given + [d for d in range(len(shape)) if d not in given]
        first, src, dims = 0, make_node(g, aten.permute.default, (x, perm), like=n), [shape[p] for p in perm]
    sizes = dims[first:first + k]
    flat = None
    for j, d in enumerate(given):
        term = _wrapped(g, indices[d], sizes[j], n)
        stride = math.prod(sizes[j + 1:])
        if stride != 1:
            term = make_node(g, aten.mul.Tensor, (term, stride), like=n)
        flat = term if flat is None else make_node(g, aten.add.Tensor, (flat, term), like=n)
    merged = dims[:first] + [math.prod(sizes)] + dims[first + k:]
    src = make_node(g, aten.reshape.default, (src, merged), like=n)
    return make_node(g, aten.index.Tensor, (src, [None] * first + [flat]), like=n)


FLAT_INDEX = Rewrite("flat_index", op_pattern(aten.index.Tensor, "flat_index"), flat_index,
                     (several_index_tensors, static_source, integer_indices), "one GATHER")
