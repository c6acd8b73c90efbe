"""``circle.cached_attention`` (``dialect/attention.py``): a decode step's attention that reads
the KV cache inputs themselves.

``q`` [B,H,L,E] is grouped to [B,Hkv,rep*L,E] (a free RESHAPE, as in ``_attention_gqa.py``), then

- scores over the cache ``BATCH_MATMUL(q, k_past, adj_y)`` and over the new rows
  ``BATCH_MATMUL(q, k_new, adj_y)``, CONCATENATION of the two score blocks (``S + T`` values per
  query row: small next to the ``S`` rows of K it replaces), the one scaled / masked SOFTMAX
  every SDPA lowering shares (``_attention_scores.probabilities``: the same numbers as the
  attention over ``cat(K)``);
- the probabilities split (STRIDED_SLICE) into the cache's and the new rows' columns,
  ``BATCH_MATMUL(p_past, v_past)`` + ``p_new * v_new`` (one new row: a broadcasting MUL).

``v_past`` transposed (``[B,Hkv,E,S]``) is read with ``adj_y``: onert's BatchMatMul transposes a
right-hand side given without it into a temporary on every call (cker's ``BatchMatMul::prepare``
/ ``transposeRowsCols``), which for V is a copy of the cache per layer and step: the plain layout
is accepted (exact) but pays that copy (docs/onert-findings.md, "Decode attention without
copying the cache").
"""
from __future__ import annotations

import torch

from ..registry import lowering
from ._attention_scores import probabilities
from ._common import BO, options

circle = torch.ops.circle


def _slice_cols(ctx, x, dims, lo, hi, dt, name):
    out = ctx.new_tensor(dims[:-1] + [hi - lo], dt, name)
    begin = ctx.int_const([0] * (len(dims) - 1) + [lo], f"{name}_begin")
    end = ctx.int_const(dims[:-1] + [hi], f"{name}_end")
    ctx.op(BO.STRIDED_SLICE, [x, begin, end, ctx.int_const([1] * len(dims), f"{name}_strides")], [out],
           options("StridedSliceOptions"))
    return out


def _first(ctx, x, dims, dt, name):
    """The leading block ``dims`` of tensor ``x`` (a SLICE from 0)."""
    out = ctx.new_tensor(dims, dt, name)
    ctx.op(BO.SLICE, [x, ctx.int_const([0] * len(dims), f"{name}_begin"), ctx.int_const(dims, f"{name}_size")], [out],
           options("SliceOptions"))
    return out


@lowering(circle.cached_attention.default)
def cached_attention(ctx, node):
    q, k_past, k_new, v_past, v_new, mask, scale, v_transposed = node.args[:8]
    rows_read = node.args[8] if len(node.args) > 8 else node.kwargs.get("rows", -1)
    dt = ctx.dtype(node)
    b, h, L, e = ctx.dims(q, static=True)
    _, hk, S, _ = ctx.dims(k_past, static=True)
    T = ctx.dims(k_new, static=True)[2]
    ev = ctx.dims(v_new, static=True)[3]
    want_v = [b, hk, ev, S] if v_transposed else [b, hk, S, ev]
    if ctx.dims(v_past, static=True) != want_v or h % hk:
        raise ctx.error(f"cached attention: V cache {ctx.dims(v_past)} is not {want_v}, or query heads {h} are "
                        f"not a multiple of key/value heads {hk}")
    kt, vt = ctx.tensor(k_past), ctx.tensor(v_past)
    if 0 <= rows_read < S:  # a bucket: the caches' first rows, by SLICE (faster than STRIDED_SLICE here)
        S = rows_read
        kt = _first(ctx, kt, [b, hk, S, e], dt, "k_bucket")
        vt = _first(ctx, vt, [b, hk, ev, S] if v_transposed else [b, hk, S, ev], dt, "v_bucket")
    rows, n = h // hk * L, S + T
    qg = ctx.reshaped(ctx.tensor(q), [b, hk, rows, e], name="q_grouped")
    adj = options("BatchMatMulOptions", adjointRhs=True)
    sp = ctx.new_tensor([b, hk, rows, S], dt, "scores_cache")
    ctx.op(BO.BATCH_MATMUL, [qg, kt], [sp], adj)
    sn = ctx.new_tensor([b, hk, rows, T], dt, "scores_new")
    ctx.op(BO.BATCH_MATMUL, [qg, ctx.tensor(k_new)], [sn], adj)
    grouped = ctx.new_tensor([b, hk, rows, n], dt, "scores_grouped")
    ctx.op(BO.CONCATENATION, [sp, sn], [grouped], options("ConcatenationOptions", axis=3))
    scores = ctx.reshaped(grouped, [b, h, L, n], name="scores")
    probs, dims, _ = probabilities(ctx, scores, [b, h, L, n], [b, h, L, n], q=q, k=k_past, mask=mask, scale=scale,
                                   is_causal=False, dynamic=False, dt=dt)
    if list(dims) != [b, h, L, n]:
        raise ctx.error(f"cached attention: a mask that broadcasts the scores to {dims} is not supported")
    pg = ctx.reshaped(probs, [b, hk, rows, n], name="probs_grouped")
    pp = _slice_cols(ctx, pg, [b, hk, rows, n], 0, S, dt, "probs_cache")
    pn = _slice_cols(ctx, pg, [b, hk, rows, n], S, n, dt, "probs_new")
    out_cache = ctx.new_tensor([b, hk, rows, ev], dt, "out_cache")
    ctx.op(BO.BATCH_MATMUL, [pp, vt], [out_cache],
           options("BatchMatMulOptions", adjointRhs=bool(v_transposed)))
    out_new = ctx.new_tensor([b, hk, rows, ev], dt, "out_new")
    if T == 1:  # [.., rows, 1] * [.., 1, ev]: one new row needs no matrix product
        ctx.op(BO.MUL, [pn, ctx.tensor(v_new)], [out_new], options("MulOptions"))
    else:
        ctx.op(BO.BATCH_MATMUL, [pn, ctx.tensor(v_new)], [out_new], options("BatchMatMulOptions"))
    summed = ctx.new_tensor([b, hk, rows, ev], dt, "out_grouped")
    ctx.op(BO.ADD, [out_cache, out_new], [summed], options("AddOptions"))
    ctx.op(BO.RESHAPE, [summed, ctx.int_const([b, h, L, ev])], [ctx.output(node)])
