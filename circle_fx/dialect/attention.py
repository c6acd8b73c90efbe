"""``circle.cached_attention``: one decode step's attention over a KV cache and its new rows,
without the cache copy ``cat([cache, new_rows])`` would make.

What it computes is exactly ``scaled_dot_product_attention(q, cat([k_past, k_new], -2),
cat([v_past, v_new], -2), mask, scale=scale)`` (grouped-query when ``q`` has more heads than
``k_past``), with ``v_past`` given transposed (``[B, Hkv, D, S]``) when ``v_transposed``: the
layout in which onert's BATCH_MATMUL reads V without transposing it into a temporary on every
call (docs/onert-findings.md, "Decode attention without copying the cache"). Produced by
:class:`~circle_fx.passes.cached_attention.CachedAttention` from the decode step
``export_llm`` captures; lowered by ``emit/lowerings/_attention_cached.py``: scores over the
cache and over the new rows by two BATCH_MATMULs that read the cache input itself, one
SOFTMAX over both (the scores are concatenated, ``S + 1`` values per query head, not the
``S + 1`` rows of K and V), the probabilities split again for the two products with V.
``rows`` >= 0: only the caches' first ``rows`` positions are read (a decode cache-length bucket
of the whole ``max_seq_len`` caches): the lowering slices them with SLICE, which onert runs ~1.7x
faster than STRIDED_SLICE for the transposed V cache's columns (192 runs of ``rows`` floats).
Owned by no fusion family: a pass of ``export_llm``'s decode pipeline makes it.
"""
from __future__ import annotations

import torch

from .base import define


def _eager(q, k_past, k_new, v_past, v_new, mask, scale: float, v_transposed: bool, rows: int = -1):
    if v_transposed:
        v_past = v_past.transpose(-1, -2)
    if rows >= 0:  # a cache-length bucket: its first ``rows`` rows
        k_past, v_past = k_past[:, :, :rows], v_past[:, :, :rows]
    k = torch.cat([k_past, k_new], dim=-2)
    v = torch.cat([v_past, v_new], dim=-2)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                                            enable_gqa=q.shape[1] != k.shape[1])


def _fake(q, k_past, k_new, v_past, v_new, mask, scale: float, v_transposed: bool, rows: int = -1):
    return q.new_empty((*q.shape[:-1], v_new.shape[-1]))


#: ``torch.ops.circle.cached_attention.default``
cached_attention = define(
    "cached_attention(Tensor q, Tensor k_past, Tensor k_new, Tensor v_past, Tensor v_new, Tensor? mask, "
    "float scale, bool v_transposed, int rows=-1) -> Tensor", _eager, _fake)
