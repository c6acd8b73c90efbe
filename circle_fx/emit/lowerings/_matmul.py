"""``torch.matmul`` semantics on BATCH_MATMUL: 1-D operands.

torch's matmul takes 1-D operands: ``[K]`` is the matrix ``[1, K]`` on the left and ``[K, 1]``
on the right, and its dim is dropped from the product (a RESHAPE after). Batch dims of any
rank and a constant lhs are emitted as they are: the ``ranks`` legalization step
(``emit/legalize/ranks.py``) folds operands above the ranks onert 0.1.0's BATCH_MATMUL takes,
and the ``constant_lhs`` step (``emit/legalize/forms.py``) swaps the operands of a product
whose lhs is a constant, which onert refuses.
"""
from __future__ import annotations

from ...circle.dims import broadcast, padded
from ._common import BO, options


def batch_matmul(ctx, a: int, b: int, out: int) -> None:
    """``out = a @ b`` (torch.matmul semantics) on Circle tensors ``a``, ``b``, ``out``."""
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
