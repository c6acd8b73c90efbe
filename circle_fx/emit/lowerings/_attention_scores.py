"""The tail every attention lowering shares: scores -> scaled -> masked -> SOFTMAX.

``scaled_dot_product_attention`` (``attention.py``) and its grouped-query form
(``_attention_gqa.py``) differ in how they form the scores ``q @ k^T`` and multiply the
probabilities with V; what lies between is this one function, so a mask rule or a scaling
change is made once.

Masks: ``is_causal=True`` adds a constant ``-inf`` upper triangle; with a dynamic length it is
built on device from prefix-sum positions (``scan.causal_allowed``: onert 0.1.0 has no
RANGE/CUMSUM), which needs the dim's max. A constant boolean mask (the folded causal mask of
``transformers`` models) becomes an additive float constant; a run-time boolean mask uses
SELECT_V2 with the dtype's lowest finite value, not -inf: in a padded batch (left padding)
some query rows have every key masked; -inf made their softmax NaN, and 0 * NaN in the next
BATCH_MATMUL spread NaN to every position. torch returns 0 for such rows, this returns the
mean of V: both finite, and those rows are padding. A float mask is added.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...circle.dims import broadcast
from ..types import numpy_dtype
from ._common import BO, operand, options
from .scan import causal_allowed


def probabilities(ctx, scores, dims, hint, *, q, k, mask, scale, is_causal: bool, dynamic: bool, dt):
    """``softmax(scores * scale + causal + mask)`` over the last axis; returns
    ``(probs, dims, hint)`` (the mask may broadcast the scores larger)."""
    scale = 1.0 / math.sqrt(ctx.shape_hint(q)[-1]) if scale is None else scale
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
    return probs, dims, hint


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
