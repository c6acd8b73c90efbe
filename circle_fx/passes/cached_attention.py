"""Decode attention over a KV cache without copying it:
``sdpa(q, cat([k_past, k_new], 2), cat([v_past, v_new], 2), mask)`` -> ``circle.cached_attention``.

``export_llm``'s decode step hands the model ``cat([cache_input, new_row])`` for its keys and
values (``llm/cache.py`` ``GraphCache.update``: onert has no DYNAMIC_UPDATE_SLICE), and the
attention reads that. As Circle, the CONCATENATION reads and writes the whole cache of every
layer on every step, before the attention reads it once more: with 4-bit weights this copy
is most of a long-context step (issue 32 item 4). The op this pass makes takes the cache and
the new rows apart (``dialect/attention.py``), and its lowering reads the cache input itself.

``v_past`` given as ``transpose(v_cache, 2, 3)`` (the decode step's value caches kept as
``[B, Hkv, D, S]``, see ``llm/cache.py``) is taken with the transpose folded in
(``v_transposed``): onert's BATCH_MATMUL reads a right-hand side in that layout directly, and
transposes any other into a temporary per call.

A decode cache-length bucket's ``cache[:, :, :rows]`` (``[..., :rows]`` for a transposed V) is folded
into the op as ``rows``: the lowering slices the whole cache inputs with SLICE, faster there than the
STRIDED_SLICE a plain slice lowers to (docs/onert-findings.md, "Bucket slices").

Forms taken (others are left as they are, exact as before): 4-D static shapes, no dropout, not
``is_causal`` (the decode step passes a mask), the concatenations along the rows (dim 2)
and read by this attention only. ``export_llm`` runs this pass in its decode pipeline, after
:class:`~circle_fx.passes.gqa.GroupedQueryAttention`; the default pipeline does not.
"""
from __future__ import annotations

import math

import torch

from ..dialect.attention import cached_attention
from ..fx_utils import arguments, erase_unused, make_node, shape_of
from ..pass_protocol import Pass

aten = torch.ops.aten


def _static4(node) -> tuple | None:
    s = shape_of(node)
    return s if s is not None and len(s) == 4 and all(isinstance(d, int) for d in s) else None


def _rows_cat(node):
    """``(past, new)`` if ``node`` is ``cat([past, new], dim=2)`` of 4-D static tensors read only
    by one node, else None."""
    if not (getattr(node, "op", None) == "call_function" and node.target is aten.cat.default):
        return None
    parts = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if len(parts) != 2 or dim not in (2, -2) or len(node.users) != 1:
        return None
    if any(_static4(p) is None for p in parts):
        return None
    return parts[0], parts[1]


def untransposed(node):
    """``x`` if ``node`` swaps the last two dims of a 4-D ``x`` (``transpose(x, 2, 3)`` or
    ``permute(x, [0, 1, 3, 2])``), else None."""
    if getattr(node, "op", None) != "call_function":
        return None
    if node.target is aten.transpose.int and sorted(d % 4 for d in node.args[1:3]) == [2, 3]:
        return node.args[0]
    if node.target is aten.permute.default and [d % 4 for d in node.args[1]] == [0, 1, 3, 2]:
        return node.args[0]
    return None


def _prefix(node, dim: int):
    """``(x, rows)`` if ``node`` is ``x[..., :rows]`` along ``dim`` of a 4-D ``x`` (``slice(x, dim, 0, rows, 1)``,
    read by one node), else ``(node, None)``."""
    if not (getattr(node, "op", None) == "call_function" and node.target is aten.slice.Tensor and len(node.users) == 1):
        return node, None
    x, d, start, end, step = arguments(node)
    xs = _static4(x)
    if xs is None or d % 4 != dim or start not in (0, None) or step != 1 or not isinstance(end, int):
        return node, None
    rows = min(end, xs[dim])
    return (x, rows) if 0 < rows < xs[dim] else (node, None)


class CachedAttention(Pass):
    name = "cached_attention"

    def run(self, program) -> bool:
        g = program.graph
        changed = False
        for node in list(g.nodes):
            if node.op != "call_function" or node.target is not aten.scaled_dot_product_attention.default:
                continue
            q, k, v, mask, dropout, causal, scale, _gqa = arguments(node)
            qs = _static4(q)
            kp = _rows_cat(k)
            vp = _rows_cat(v)
            if qs is None or kp is None or vp is None or dropout or causal:
                continue
            (k_past, k_new), (v_past, v_new) = kp, vp
            hk = shape_of(k_past)[1]
            if qs[1] % hk or shape_of(v_past)[1] != hk or shape_of(k_past)[0] != qs[0]:
                continue
            past_t = untransposed(v_past)
            transposed = past_t is not None and len(v_past.users) == 1
            v_read = past_t if transposed else v_past
            scale = 1.0 / math.sqrt(qs[-1]) if scale is None else float(scale)
            # a bucket's caches: the first rows of the whole caches, sliced by the op's lowering (SLICE)
            (k_full, k_rows), (v_full, v_rows) = _prefix(k_past, 2), _prefix(v_read, 3 if transposed else 2)
            rows = k_rows if k_rows is not None and k_rows == v_rows else -1
            if rows >= 0:
                v_read = v_full
            with g.inserting_before(node):
                new = make_node(g, cached_attention, (q, k_full if rows >= 0 else k_past, k_new, v_read, v_new,
                                                      mask, scale, transposed, rows), like=node)
            node.replace_all_uses_with(new)
            g.erase_node(node)
            erase_unused(g, [k, v] + ([v_past] if transposed else []) + ([k_past, past_t if transposed else v_past]
                                                                          if rows >= 0 else []))
            changed = True
        return changed
