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

aten = torch.ops.aten


def _wrapped(g: fx.Graph, i: fx.Node, size: int, like: fx.Node) -> fx.Node:
    """``i + size * (i < 0)``: no SELECT_V2 (onert has no int64 kernel for it)."""
    negative = make_node(g, aten.lt.Scalar, (i, 0), like=like)
    as_int = make_node(g, aten._to_copy.default, (negative,), {"dtype": dtype_of(i)}, like=like)
    offset = make_node(g, aten.mul.Tensor, (as_int, size), like=like)
    return make_node(g, aten.add.Tensor, (i, offset), like=like)


def flat_index(n: fx.Node, g: fx.Graph) -> fx.Node | None:
    """Rewrite rule for ``aten.index.Tensor``; ``None`` leaves single-index (or boolean) cases alone."""
    x, indices = n.args[0], list(n.args[1])
    given = [d for d, i in enumerate(indices) if i is not None]
    shape = static_shape(x)
    if len(given) < 2 or shape is None:
        return None
    if any(dtype_of(indices[d]) in (None, torch.bool, torch.uint8) for d in given):
        return None  # boolean masks select a data-dependent number of elements
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
