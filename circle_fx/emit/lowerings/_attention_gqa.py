"""Grouped-query SDPA (``Hkv`` K/V heads, ``H = rep * Hkv`` query heads) without repeating K/V.

Query head ``h`` attends with K/V head ``h // rep``, and the query heads of one group are
contiguous, so ``q`` [B,H,L,E] reshapes for free to [B,Hkv,rep*L,E]: one BATCH_MATMUL per
K/V head covers its whole group. The scores are reshaped to [B,H,L,S] for the mask and the
4-D SOFTMAX (onert's fast path), then back for the product with V. Repeating K/V to H heads
(GATHER or BROADCAST_TO) copies them; in a KV-cache decode step that is the whole cache per
layer and call (a quarter of the 125M Llama's decode time, docs/onert-findings.md §7).
K is read through BATCH_MATMUL's ``adjointRhs`` (onert honours it: findings §3; exact in
tests/passes/test_gqa.py) instead of a TRANSPOSE, for the same reason.

Static shapes only (the caller falls back to repeating heads for dynamic lengths); not
called with ``is_causal`` (the caller's constant triangle handles that case).
"""
from __future__ import annotations

from ._attention_scores import probabilities
from ._common import BO, options


def sdpa_grouped(ctx, node, q, k, v, mask, scale):
    dt = ctx.dtype(node)
    b, h, L, e = ctx.shape_hint(q)
    kb, hk, S, _ = ctx.shape_hint(k)
    vb, _, _, ev = ctx.shape_hint(v)
    rep = h // hk
    if kb != b or vb != b:
        raise ctx.error(f"grouped attention with query batch {b} and key/value batch {kb}/{vb} is not supported")
    qg = ctx.new_tensor([b, hk, rep * L, e], dt, "q_grouped")
    ctx.op(BO.RESHAPE, [ctx.tensor(q), ctx.int_const([b, hk, rep * L, e])], [qg])
    grouped = ctx.new_tensor([b, hk, rep * L, S], dt, "scores_grouped")
    ctx.op(BO.BATCH_MATMUL, [qg, ctx.tensor(k)], [grouped], options("BatchMatMulOptions", adjointRhs=True))
    scores = ctx.new_tensor([b, h, L, S], dt, "scores")
    ctx.op(BO.RESHAPE, [grouped, ctx.int_const([b, h, L, S])], [scores])
    probs, dims, _ = probabilities(ctx, scores, [b, h, L, S], [b, h, L, S], q=q, k=k, mask=mask, scale=scale,
                                   is_causal=False, dynamic=False, dt=dt)
    if list(dims) != [b, h, L, S]:
        raise ctx.error(f"a mask that broadcasts the scores to {dims} is not supported with grouped K/V heads")
    probs_g = ctx.new_tensor([b, hk, rep * L, S], dt, "probs_grouped")
    ctx.op(BO.RESHAPE, [probs, ctx.int_const([b, hk, rep * L, S])], [probs_g])
    out_g = ctx.new_tensor([b, hk, rep * L, ev], dt, "out_grouped")
    ctx.op(BO.BATCH_MATMUL, [probs_g, ctx.tensor(v)], [out_g], options("BatchMatMulOptions"))
    ctx.op(BO.RESHAPE, [out_g, ctx.int_const([b, h, L, ev])], [ctx.output(node)])
