"""``scaled_dot_product_attention`` when the sequence (or batch) length is dynamic.

The static lowering (``attention.py``) builds masks and head repeats from known sizes.
Here sizes are only known at run time, so:

- key/value heads are repeated for grouped-query attention with a GATHER along the head
  axis (indices ``h // group``), which needs no shape operand;
- intermediate tensors carry -1 in their shape signature for every dynamic dim;
- ``is_causal=True`` is rejected with a clear error: its mask depends on the length, and
  building it on device needs RANGE/CUMSUM-like ops onert 0.1.0 lacks. An explicit mask
  input (bool -> SELECT_V2, float -> ADD) works.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...fx_utils import arguments
from ..types import numpy_dtype
from ._common import BO, operand, options


def _sig(ctx, value):
    shape, sig = ctx.shape_of(value)
    return shape, (sig if sig is not None else list(shape))


def _broadcast_dims(a, b):
    """Broadcast two shape signatures (-1 = dynamic)."""
    out = []
    for x, y in zip([1] * (len(b) - len(a)) + list(a), [1] * (len(a) - len(b)) + list(b)):
        out.append(y if x == 1 else x if y == 1 else -1 if -1 in (x, y) else x)
    return out


def sdpa_dynamic(ctx, node):
    q, k, v, mask, dropout_p, is_causal, scale, enable_gqa = arguments(node)
    if is_causal:
        raise ctx.error("is_causal=True with a dynamic sequence length is not supported: the mask depends "
                        "on the length at run time (onert has no RANGE/CUMSUM to build it); pass an explicit "
                        "attention mask as a model input, or export with static shapes")
    dt = ctx.dtype(node)
    (qs, qsig), (ks, ksig), (vs, vsig) = _sig(ctx, q), _sig(ctx, k), _sig(ctx, v)
    rank = len(qs)
    kt, vt = ctx.tensor(k), ctx.tensor(v)
    if rank == 4 and ks[1] != qs[1]:
        if qs[1] % ks[1]:
            raise ctx.error(f"query heads {qs[1]} are not a multiple of key/value heads {ks[1]}")
        kt, ks, ksig = _repeat_heads(ctx, kt, ks, ksig, qs[1], dt, "k")
        vt, vs, vsig = _repeat_heads(ctx, vt, vs, vsig, qs[1], dt, "v")
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    k_t = ctx.new_tensor([ks[p] for p in perm], dt, "kT", [ksig[p] for p in perm])
    ctx.op(BO.TRANSPOSE, [kt, ctx.int_const(perm, "perm")], [k_t])
    batch = list(np.broadcast_shapes(tuple(qs[:-2]), tuple(ks[:-2])))
    shape = batch + [qs[-2], ks[-2]]
    sig = _broadcast_dims(qsig[:-2], ksig[:-2]) + [qsig[-2], ksig[-2]]
    scores = ctx.new_tensor(shape, dt, "scores", sig)
    ctx.op(BO.BATCH_MATMUL, [ctx.tensor(q), k_t], [scores], options("BatchMatMulOptions"))
    scale = 1.0 / math.sqrt(qs[-1]) if scale is None else scale
    scaled = ctx.new_tensor(shape, dt, "scaled", sig)
    ctx.op(BO.MUL, [scores, ctx.tensor(float(scale), dt)], [scaled], options("MulOptions"))
    logits = scaled
    if mask is not None:
        if mask.op == "get_attr":
            raise ctx.error("a constant attention mask cannot follow a dynamic sequence length")
        mshape, msig = _sig(ctx, mask)
        out_shape = list(np.broadcast_shapes(tuple(shape), tuple(mshape)))
        out_sig = _broadcast_dims(sig, msig)
        logits = ctx.new_tensor(out_shape, dt, "masked", out_sig)
        if ctx.dtype(mask) == torch.bool:
            ninf = ctx.const(np.array(-np.inf, dtype=numpy_dtype(dt)), "ninf")
            ctx.op(BO.SELECT_V2, [ctx.tensor(mask), scaled, ninf], [logits])
        else:
            ctx.op(BO.ADD, [scaled, operand(ctx, mask, dt)], [logits], options("AddOptions"))
        shape, sig = out_shape, out_sig
    probs = ctx.new_tensor(shape, dt, "probs", sig)
    ctx.op(BO.SOFTMAX, [logits], [probs], options("SoftmaxOptions", beta=1.0))
    ctx.op(BO.BATCH_MATMUL, [probs, vt], [ctx.output(node)], options("BatchMatMulOptions"))


def _repeat_heads(ctx, t, shape, sig, heads, dt, name):
    """GQA: kv head ``h // group`` for query head ``h``, as one GATHER on axis 1."""
    group = heads // shape[1]
    index = ctx.int_const([h // group for h in range(heads)], f"{name}_heads")
    out_shape, out_sig = list(shape), list(sig)
    out_shape[1] = out_sig[1] = heads
    out = ctx.new_tensor(out_shape, dt, f"{name}_rep", out_sig)
    ctx.op(BO.GATHER, [t, index], [out], options("GatherOptions", axis=1, batchDims=0))
    return out, out_shape, out_sig
