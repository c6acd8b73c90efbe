"""``scaled_dot_product_attention`` as BATCH_MATMUL / MUL / mask / SOFTMAX / BATCH_MATMUL.

One lowering for static and dynamic (sequence or batch) lengths: every intermediate is
made from ``ctx.dims`` (-1 for a dynamic dim), so a dynamic length simply carries -1
through.

- Grouped-query attention with static shapes multiplies each key/value head with its group
  of query heads (``_attention_gqa.py``: no copy of K/V, which in a KV-cache decode step is
  the whole cache). With a dynamic length it repeats key/value head ``h // group`` for query
  head ``h`` with one GATHER on the head axis (indices are known at compile time; no shape
  operand).
- K is transposed explicitly here (the grouped path uses BATCH_MATMUL's adjointRhs, which
  onert 0.1.0 honours: docs/onert-findings.md §3 and §7).
- Masks: ``is_causal=True`` adds a constant ``-inf`` upper triangle; with a dynamic length
  it is built on device from prefix-sum positions (``scan.causal_allowed``: onert 0.1.0 has
  no RANGE/CUMSUM), which needs the dim's max. A constant boolean mask (the folded
  causal mask of ``transformers`` models) becomes an additive float constant; a run-time
  boolean mask uses SELECT_V2 with the dtype's lowest finite value, not -inf: in a padded
  batch (left padding) some query rows have every key masked; -inf made their softmax NaN,
  and 0 * NaN in the next BATCH_MATMUL spread NaN to every position. torch returns 0 for
  such rows, this returns the mean of V: both finite, and those rows are padding. A float
  mask is added.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...circle.dims import broadcast
from ...fx_utils import arguments
from ..registry import lowering
from ..types import numpy_dtype
from .scan import causal_allowed
from ._attention_gqa import sdpa_grouped
from ._matmul import batch_matmul
from ._common import BO, operand, options

aten = torch.ops.aten


@lowering(aten.scaled_dot_product_attention.default)
def sdpa(ctx, node):
    q, k, v, mask, dropout_p, is_causal, scale, enable_gqa = arguments(node)
    if dropout_p:
        raise ctx.error("attention dropout is not supported (export the model in eval mode)")
    dynamic = any(ctx.is_dynamic(t) for t in (q, k, v))
    dt = ctx.dtype(node)
    qd, kd, vd = ctx.dims(q), ctx.dims(k), ctx.dims(v)
    qh, kh, vh = ctx.shape_hint(q), ctx.shape_hint(k), ctx.shape_hint(v)
    rank = len(qd)
    kt, vt = ctx.tensor(k), ctx.tensor(v)
    if rank == 4 and kh[1] != qh[1]:
        if qh[1] % kh[1]:
            raise ctx.error(f"query heads {qh[1]} are not a multiple of key/value heads {kh[1]}")
        if not dynamic and not is_causal and ctx.constant(q) is None:  # (a constant q: the path below)
            return sdpa_grouped(ctx, node, q, k, v, mask, scale, _apply_mask)
        kt, kd, kh = _repeat_heads(ctx, kt, kd, kh, qh[1], dt, "k")
        vt, vd, vh = _repeat_heads(ctx, vt, vd, vh, qh[1], dt, "v")
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    k_t = ctx.new_tensor([kd[p] for p in perm], dt, "kT", [kh[p] for p in perm])
    ctx.op(BO.TRANSPOSE, [kt, ctx.int_const(perm, "perm")], [k_t])
    dims = broadcast(qd[:-2], kd[:-2]) + [qd[-2], kd[-2]]
    hint = broadcast(qh[:-2], kh[:-2]) + [qh[-2], kh[-2]]
    scores = ctx.new_tensor(dims, dt, "scores", hint)
    # a constant q (DETR's first decoder layer: learned queries, folded before its cross-attention)
    # is a constant lhs onert 0.1.0 refuses: the constant_lhs legalization step swaps the operands
    batch_matmul(ctx, ctx.tensor(q), k_t, scores)
    scale = 1.0 / math.sqrt(qh[-1]) if scale is None else scale
    logits = ctx.new_tensor(dims, dt, "scaled", hint)
    ctx.op(BO.MUL, [scores, ctx.tensor(float(scale), dt)], [logits], options("MulOptions"))
    if is_causal and dynamic:  # the mask from positions built on device (no RANGE/CUMSUM needed)
        out = ctx.new_tensor(dims, dt, "causal", hint)
        ninf = ctx.const(np.array(-np.inf, dtype=numpy_dtype(dt)), "ninf")
        ctx.op(BO.SELECT_V2, [causal_allowed(ctx, q, k, len(dims)), logits, ninf], [out])
        logits = out
    elif is_causal:
        L, S = hint[-2], hint[-1]
        causal = np.where(np.tril(np.ones((L, S), dtype=bool)), 0, -np.inf).astype(numpy_dtype(dt))
        out = ctx.new_tensor(dims, dt, "causal", hint)
        ctx.op(BO.ADD, [logits, ctx.const(causal, "causal_mask")], [out], options("AddOptions"))
        logits = out
    if mask is not None:
        logits, dims, hint = _apply_mask(ctx, logits, dims, hint, mask, dt, dynamic)
    probs = ctx.new_tensor(dims, dt, "probs", hint)
    ctx.op(BO.SOFTMAX, [logits], [probs], options("SoftmaxOptions", beta=1.0))
    ctx.op(BO.BATCH_MATMUL, [probs, vt], [ctx.output(node)], options("BatchMatMulOptions"))


def _repeat_heads(ctx, t, dims, hint, heads, dt, name):
    """GQA: kv head ``h // group`` for query head ``h``, as one GATHER on axis 1."""
    group = heads // hint[1]
    index = ctx.int_const([h // group for h in range(heads)], f"{name}_heads")
    dims, hint = list(dims), list(hint)
    dims[1] = hint[1] = heads
    out = ctx.new_tensor(dims, dt, f"{name}_rep", hint)
    ctx.op(BO.GATHER, [t, index], [out], options("GatherOptions", axis=1, batchDims=0))
    return out, dims, hint


def _apply_mask(ctx, scores, dims, hint, mask, dt, dynamic):
    const = ctx.constant(mask)
    if const is not None and dynamic:
        raise ctx.error("a constant attention mask cannot follow a dynamic sequence length")
    dims = broadcast(dims, ctx.dims(mask))
    hint = broadcast(hint, ctx.shape_hint(mask))
    out = ctx.new_tensor(dims, dt, "masked", hint)
    npdt = numpy_dtype(dt)
    if ctx.dtype(mask) != torch.bool:
        ctx.op(BO.ADD, [scores, operand(ctx, mask, dt)], [out], options("AddOptions"))
    elif const is not None:
        additive = np.where(const.numpy(), 0, -np.inf).astype(npdt)
        ctx.op(BO.ADD, [scores, ctx.const(additive, "mask")], [out], options("AddOptions"))
    else:
        lowest = ctx.const(np.array(np.finfo(npdt).min, dtype=npdt), "masked_score")
        ctx.op(BO.SELECT_V2, [ctx.tensor(mask), scores, lowest], [out])
    return out, dims, hint
