"""``torch.matmul`` semantics on BATCH_MATMUL: 1-D operands and a constant lhs.

torch's matmul takes 1-D operands: ``[K]`` is the matrix ``[1, K]`` on the left and ``[K, 1]``
on the right, and its dim is dropped from the product (a RESHAPE after). Batch dims of any
rank are emitted as they are: the ``ranks`` legalization step (``emit/legalize/ranks.py``)
folds operands above the ranks onert 0.1.0's BATCH_MATMUL takes.
"""
from __future__ import annotations

from ...circle.dims import broadcast, padded
from ._common import BO, options


def batch_matmul(ctx, a: int, b: int, out: int) -> None:
    """``out = a @ b`` (torch.matmul semantics) on Circle tensors ``a``, ``b``, ``out``."""
    lhs = ctx.tensor_constant(a)
    if lhs is not None and ctx.tensor_dtype(a).is_floating_point and ctx.tensor_constant(b) is None:
        _constant_lhs(ctx, lhs, b, out)
        return
    ad, bd = ctx.tensor_dims(a), ctx.tensor_dims(b)
    if len(ad) >= 2 and len(bd) >= 2:
        ctx.op(BO.BATCH_MATMUL, [a, b], [out], options("BatchMatMulOptions"))
        return
    ah, bh = ctx.tensor_hint(a), ctx.tensor_hint(b)
    if len(ad) == 1:
        ad, ah = [1] + ad, [1] + ah
        a = ctx.reshaped(a, ad, ah, "mm_lhs")
    if len(bd) == 1:
        bd, bh = bd + [1], bh + [1]
        b = ctx.reshaped(b, bd, bh, "mm_rhs")
    n = max(len(ad), len(bd)) - 2
    batch = broadcast(ad[:-2], bd[:-2])
    hint = [max(x, y) for x, y in zip(padded(ah[:-2], n), padded(bh[:-2], n))]
    mm = ctx.new_tensor(batch + [ad[-2], bd[-1]], ctx.tensor_dtype(out), "mm_2d", hint + [ah[-2], bh[-1]])
    ctx.op(BO.BATCH_MATMUL, [a, b], [mm], options("BatchMatMulOptions"))
    ctx.op(BO.RESHAPE, [mm, ctx.shape_operand(ctx.tensor_dims(out))], [out])


def _constant_lhs(ctx, lhs, b: int, out: int) -> None:
    """``A @ B`` with a constant ``A`` (Mamba's ``dt_proj.weight @ x``, ``W @ v``): onert 0.1.0
    refuses a constant BATCH_MATMUL lhs ("OperationValidator failed at line 123"; a constant
    rhs is fine), so this computes ``(B^T @ A^T)^T`` with ``A^T`` transposed at compile time.
    Every BATCH_MATMUL whose lhs can be a constant is emitted through here (matmul, bmm, the
    linear's BATCH_MATMUL form, attention's ``q @ K^T``), at every rank. A 1-D
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
