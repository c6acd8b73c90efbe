"""``scaled_dot_product_attention`` as BATCH_MATMUL / MUL / mask / SOFTMAX / BATCH_MATMUL.

Masks: a constant boolean mask (the folded causal mask of ``transformers`` models) is
turned into an additive float constant at compile time; a runtime boolean mask uses
SELECT_V2; a float mask is added. Grouped-query attention repeats K/V heads with
RESHAPE + BROADCAST_TO. onert ignores BATCH_MATMUL's adjoint flags, so K is transposed
explicitly.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...fx_utils import arguments
from ...program import fetch_attr
from ..registry import lowering
from ..types import numpy_dtype
from ._common import BO, operand, options

aten = torch.ops.aten


@lowering(aten.scaled_dot_product_attention.default)
def sdpa(ctx, node):
    q, k, v, mask, dropout_p, is_causal, scale, enable_gqa = arguments(node)
    if dropout_p:
        raise ctx.error("attention dropout is not supported (export the model in eval mode)")
    if any(ctx.is_dynamic(t) for t in (q, k, v)):
        from .attention_dynamic import sdpa_dynamic

        return sdpa_dynamic(ctx, node)
    dt = ctx.dtype(node)
    qs, ks, vs = ctx.static_shape(q), ctx.static_shape(k), ctx.static_shape(v)
    rank = len(qs)
    L, S, E = qs[-2], ks[-2], qs[-1]
    kt, vt = ctx.tensor(k), ctx.tensor(v)
    if rank == 4 and ks[1] != qs[1]:
        if qs[1] % ks[1]:
            raise ctx.error(f"query heads {qs[1]} are not a multiple of key/value heads {ks[1]}")
        kt, ks = _repeat_heads(ctx, kt, ks, qs[1], dt, "k")
        vt, vs = _repeat_heads(ctx, vt, vs, qs[1], dt, "v")
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    k_t = ctx.new_tensor(ks[:-2] + [ks[-1], ks[-2]], dt, "kT")
    ctx.op(BO.TRANSPOSE, [kt, ctx.int_const(perm, "perm")], [k_t])
    score_shape = list(np.broadcast_shapes(tuple(qs[:-2]), tuple(ks[:-2]))) + [L, S]
    scores = ctx.new_tensor(score_shape, dt, "scores")
    ctx.op(BO.BATCH_MATMUL, [ctx.tensor(q), k_t], [scores], options("BatchMatMulOptions"))
    scale = 1.0 / math.sqrt(E) if scale is None else scale
    scaled = ctx.new_tensor(score_shape, dt, "scaled")
    ctx.op(BO.MUL, [scores, ctx.tensor(float(scale), dt)], [scaled], options("MulOptions"))
    logits = _apply_mask(ctx, scaled, score_shape, mask, is_causal, L, S, dt)
    probs = ctx.new_tensor(score_shape, dt, "probs")
    ctx.op(BO.SOFTMAX, [logits], [probs], options("SoftmaxOptions", beta=1.0))
    ctx.op(BO.BATCH_MATMUL, [probs, vt], [ctx.output(node)], options("BatchMatMulOptions"))


def _repeat_heads(ctx, t, shape, heads, dt, name):
    b, hk, s, e = shape
    rep = heads // hk
    r5 = ctx.new_tensor([b, hk, 1, s, e], dt, f"{name}5")
    ctx.op(BO.RESHAPE, [t, ctx.int_const([b, hk, 1, s, e])], [r5])
    bc = ctx.new_tensor([b, hk, rep, s, e], dt, f"{name}_rep")
    ctx.op(BO.BROADCAST_TO, [r5, ctx.int_const([b, hk, rep, s, e])], [bc])
    out = ctx.new_tensor([b, heads, s, e], dt, f"{name}_heads")
    ctx.op(BO.RESHAPE, [bc, ctx.int_const([b, heads, s, e])], [out])
    return out, [b, heads, s, e]


def _apply_mask(ctx, scores, shape, mask, is_causal, L, S, dt):
    npdt = numpy_dtype(dt)
    if is_causal:
        causal = np.where(np.tril(np.ones((L, S), dtype=bool)), 0, -np.inf).astype(npdt)
        out = ctx.new_tensor(shape, dt, "causal")
        ctx.op(BO.ADD, [scores, ctx.const(causal, "causal_mask")], [out], options("AddOptions"))
        scores = out
    if mask is None:
        return scores
    out_shape = list(np.broadcast_shapes(tuple(shape), tuple(ctx.static_shape(mask))))
    out = ctx.new_tensor(out_shape, dt, "masked")
    if ctx.dtype(mask) == torch.bool:
        if mask.op == "get_attr":
            m = fetch_attr(ctx.program.gm, mask.target).numpy()
            additive = np.where(m, 0, -np.inf).astype(npdt)
            ctx.op(BO.ADD, [scores, ctx.const(additive, "mask")], [out], options("AddOptions"))
        else:
            ninf = ctx.const(np.array(-np.inf, dtype=npdt), "ninf")
            ctx.op(BO.SELECT_V2, [ctx.tensor(mask), scores, ninf], [out])
    else:
        ctx.op(BO.ADD, [scores, operand(ctx, mask, dt)], [out], options("AddOptions"))
    return out
