"""``torch.matmul`` of any rank as one BATCH_MATMUL of rank <= 4 (what onert 0.1.0 runs).

onert 0.1.0's BATCH_MATMUL refuses operands of rank 5 or more at prepare time, but within
rank 4 it broadcasts freely: either operand's batch dims may be 1 against the other's, both
ways at once, and the ranks may differ (measured: docs/onert-findings.md §3). torch's matmul
takes any rank, 1-D operands included; linear-attention models (chunked delta rules) multiply
``[B, H, chunks, C, D]`` tensors.

So the batch positions (right-aligned; a missing position counts as 1) are classified by
how they broadcast: the same size in both operands, 1 in ``a`` only, or 1 in ``b`` only.
Positions where both are 1 are dropped; consecutive positions of one class are multiplied
into one dim (row-major, so each operand's RESHAPE is exact and the product's RESHAPE back to
torch's shape is too). Two runs fit in rank 4. More runs (1s alternating between the
operands, rare) are expanded with BROADCAST_TO first (see :func:`_expand`), after which every
position is "same" and folds into one.
A 1-D operand is the matrix ``[1, K]`` (left) or ``[K, 1]`` (right), as torch defines it.
"""
from __future__ import annotations

import math

from ...circle import limits
from ...circle.dims import numel, padded, runs
from ._broadcast_fold import broadcast_to
from ._common import BO, options

SAME, ONE_IN_A, ONE_IN_B = "same", "a1", "b1"
MAX_RANK = limits.BATCH_MATMUL  # onert 0.1.0's BATCH_MATMUL: operand ranks 2..4


def batch_matmul(ctx, a: int, b: int, out: int) -> None:
    """``out = a @ b`` (torch.matmul semantics) on Circle tensors ``a``, ``b``, ``out``."""
    lhs = ctx.tensor_constant(a)
    if lhs is not None and ctx.tensor_dtype(a).is_floating_point and ctx.tensor_constant(b) is None:
        _constant_lhs(ctx, lhs, b, out)
        return
    ad, bd = ctx.tensor_dims(a), ctx.tensor_dims(b)
    if 2 <= len(ad) <= MAX_RANK and 2 <= len(bd) <= MAX_RANK:
        ctx.op(BO.BATCH_MATMUL, [a, b], [out], options("BatchMatMulOptions"))
        return
    ah, bh = ctx.tensor_hint(a), ctx.tensor_hint(b)
    if len(ad) == 1:
        ad, ah = [1] + ad, [1] + ah
    if len(bd) == 1:
        bd, bh = bd + [1], bh + [1]
    groups = _groups(ad[:-2], ah[:-2], bd[:-2], bh[:-2])
    if len(groups) > MAX_RANK - 2:
        a, b, groups = _expand(ctx, a, b, groups, ad[-2:], bd[-2:])
    ga = [(numel(d for d, _ in g["a"]), numel(h for _, h in g["a"])) for g in groups]
    gb = [(numel(d for d, _ in g["b"]), numel(h for _, h in g["b"])) for g in groups]
    a = _reshaped(ctx, a, [d for d, _ in ga] + ad[-2:], [h for _, h in ga] + ah[-2:], "mm_lhs")
    b = _reshaped(ctx, b, [d for d, _ in gb] + bd[-2:], [h for _, h in gb] + bh[-2:], "mm_rhs")
    batch = [gb[i][0] if g["kind"] == ONE_IN_A else ga[i][0] if g["kind"] == ONE_IN_B or ga[i][0] != -1
             else gb[i][0] for i, g in enumerate(groups)]
    batch_hint = [max(ha, hb) for (_, ha), (_, hb) in zip(ga, gb)]
    dims, hint = batch + [ad[-2], bd[-1]], batch_hint + [ah[-2], bh[-1]]
    if dims == ctx.tensor_dims(out):
        ctx.op(BO.BATCH_MATMUL, [a, b], [out], options("BatchMatMulOptions"))
        return
    mm = ctx.new_tensor(dims, ctx.tensor_dtype(out), "mm_folded", hint)
    ctx.op(BO.BATCH_MATMUL, [a, b], [mm], options("BatchMatMulOptions"))
    ctx.op(BO.RESHAPE, [mm, ctx.shape_operand(ctx.tensor_dims(out))], [out])


def _constant_lhs(ctx, lhs, b: int, out: int) -> None:
    """``A @ B`` with a constant ``A`` (Mamba's ``dt_proj.weight @ x``, ``W @ v``): onert 0.1.0
    refuses a constant BATCH_MATMUL lhs ("OperationValidator failed at line 123"; a constant
    rhs is fine), so this computes ``(B^T @ A^T)^T`` with ``A^T`` transposed at compile time.
    Here, the one place that emits BATCH_MATMUL, every caller and every rank is covered. A 1-D
    ``B`` (``[K, 1]`` as torch reads it) is the row ``[1, K]`` as it stands, and a 1-D ``A``
    (``[1, K]``) is the column ``[K, 1]``: then the product needs a RESHAPE, not a TRANSPOSE."""
    bd, bh = ctx.tensor_dims(b), ctx.tensor_hint(b)
    od, oh = ctx.tensor_dims(out), ctx.tensor_hint(out)
    dtype = ctx.tensor_dtype(out)
    at = ctx.const(lhs.reshape(-1, 1) if lhs.ndim == 1 else lhs.swapaxes(-1, -2).copy(), "lhs_T")
    if len(bd) == 1:
        bt = ctx.reshaped(b, [1] + bd, [1] + bh, "rhs_T")
        pd, ph = od[:-1] + [1, od[-1]], oh[:-1] + [1, oh[-1]]
    else:
        bt = _swap_last(ctx, b, bd, bh, "rhs_T")
        pd, ph = (od + [1], oh + [1]) if lhs.ndim == 1 else (_swapped(od), _swapped(oh))
    prod = ctx.new_tensor(pd, dtype, "mm_T", ph)
    batch_matmul(ctx, bt, at, prod)
    if len(bd) == 1 or lhs.ndim == 1:
        ctx.op(BO.RESHAPE, [prod, ctx.shape_operand(od)], [out])
    else:
        _swap_last(ctx, prod, pd, ph, "mm", out)


def _swapped(dims: list[int]) -> list[int]:
    return dims[:-2] + dims[-1:] + dims[-2:-1]


def _swap_last(ctx, src: int, dims: list[int], hint: list[int], name: str, out: int | None = None) -> int:
    """TRANSPOSE of the last two dims of tensor ``src`` (``dims``/``hint`` its shape)."""
    perm = _swapped(list(range(len(dims))))
    if out is None:
        out = ctx.new_tensor(_swapped(dims), ctx.tensor_dtype(src), name, _swapped(hint))
    ctx.op(BO.TRANSPOSE, [src, ctx.int_const(perm, "perm")], [out])
    return out


def _groups(ad, ah, bd, bh) -> list[dict]:
    """Runs of consecutive batch positions that broadcast alike (:func:`circle_fx.circle.dims.runs`); each run
    lists its ``(dim, hint)`` pairs per operand (-1 dims are dynamic)."""
    n = max(len(ad), len(bd))
    ad, ah, bd, bh = padded(ad, n), padded(ah, n), padded(bd, n), padded(bh, n)
    # a static 1 against anything else broadcasts; otherwise torch guarantees equal sizes;
    # 1 in both broadcasts with anything: dropped
    kinds = [ONE_IN_A if da == 1 else ONE_IN_B if db == 1 else SAME for da, db in zip(ad, bd)]
    return [{"kind": kind, "a": [(ad[k], ah[k]) for k in ks], "b": [(bd[k], bh[k]) for k in ks]}
            for kind, ks in runs(kinds, skip=lambda k: ad[k] == 1 and bd[k] == 1)]


def _expand(ctx, a, b, groups, a_mat, b_mat):
    """More broadcast runs than rank 4 holds: each operand broadcast to the full batch
    (:func:`._broadcast_fold.broadcast_to`, which keeps BROADCAST_TO within the rank onert
    computes correctly), so every position is 'same' and the batch folds into one dim."""
    if -1 in [d for g in groups for d, _ in g["a"] + g["b"]] + a_mat + b_mat:
        raise ctx.error("matmul whose batch dims broadcast in more than two alternating runs needs "
                        "static shapes (BROADCAST_TO takes a constant shape)")
    grouped = {side: [numel(d for d, _ in g[side]) for g in groups] for side in ("a", "b")}
    full = [max(x, y) for x, y in zip(grouped["a"], grouped["b"])]
    n = math.prod(full)
    outs = []
    for t, side, mat in ((a, "a", a_mat), (b, "b", b_mat)):
        if grouped[side] == full:
            outs.append(t)  # nothing to broadcast: the fold RESHAPEs it
            continue
        wide = ctx.new_tensor([n] + mat, ctx.tensor_dtype(t), f"mm_{side}_expanded")
        broadcast_to(ctx, t, grouped[side] + mat, full + mat, wide, f"mm_{side}")
        outs.append(wide)
    return outs[0], outs[1], [{"kind": SAME, "a": [(n, n)], "b": [(n, n)]}]


def _reshaped(ctx, t: int, dims: list[int], hint: list[int], name: str) -> int:
    """``t`` as ``dims`` with leading 1s dropped (BATCH_MATMUL broadcasts ranks)."""
    while len(dims) > 2 and dims[0] == 1:
        dims, hint = dims[1:], hint[1:]
    return ctx.reshaped(t, dims, hint, name)
