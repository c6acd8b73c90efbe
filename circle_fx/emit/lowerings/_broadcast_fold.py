"""BROADCAST_TO within the rank onert 0.1.0 computes correctly.

onert 0.1.0's BROADCAST_TO is exact up to rank 5; rank 6 returns wrong values without an
error and rank 7 crashes the process (measured: docs/onert-findings.md §3). A broadcast only
needs one dim per run of consecutive dims that are all repeated or all kept (row-major, so
RESHAPEs in and out are exact), which is rarely more than three.
"""
from __future__ import annotations

from ...circle import dims, limits
from ._common import BO

MAX_RANK = limits.BROADCAST_TO


def broadcast_to(ctx, t: int, src: list[int], dst: list[int], out: int, name: str = "bcast") -> None:
    """Tensor ``t`` (``src`` dims, or any shape with as many elements) broadcast to ``dst``
    (static, same rank as ``src``) into tensor ``out`` (``dst`` dims, or as many elements)."""
    if ctx.tensor_dims(t) == src and ctx.tensor_dims(out) == dst and len(dst) <= MAX_RANK:
        ctx.op(BO.BROADCAST_TO, [t, ctx.int_const(dst)], [out])
        return
    # runs of positions all repeated or all kept; positions of target size 1 drop out
    groups = dims.runs([own == want for own, want in zip(src, dst)], skip=lambda k: dst[k] == 1)
    if len(groups) > MAX_RANK:
        raise ctx.error(f"broadcasting {src} to {dst} needs a rank-{len(groups)} BROADCAST_TO; onert 0.1.0's "
                        f"is correct up to rank {MAX_RANK} only")
    own, want = dims.fold(src, groups), dims.fold(dst, groups)
    dtype = ctx.tensor_dtype(t)
    t = ctx.reshaped(t, own, name=f"{name}_in")
    if ctx.tensor_dims(out) == want:
        ctx.op(BO.BROADCAST_TO, [t, ctx.int_const(want)], [out])
        return
    wide = ctx.new_tensor(want, dtype, f"{name}_out")
    ctx.op(BO.BROADCAST_TO, [t, ctx.int_const(want)], [wide])
    ctx.op(BO.RESHAPE, [wide, ctx.int_const(ctx.tensor_dims(out))], [out])
