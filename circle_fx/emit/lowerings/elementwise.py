"""Elementwise ops: arithmetic, unary math, comparisons, logical ops, casts, select.

Operands are brought to the op's computation dtype first (Python scalars become
constants of that dtype, tensors of another dtype get a CAST), mirroring torch's type
promotion so Circle kernels always see matching input types.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ...fx_utils import arguments, val
from ..registry import lowering
from ._common import BO, operand, options

aten = torch.ops.aten


def compute_dtype(node, *values) -> torch.dtype:
    """torch's result type for ``values`` (what an arithmetic op computes in)."""
    import torch._prims_common as pc

    vals = [val(v) for v in values]  # fake tensors for nodes, literals as they are
    return pc.elementwise_dtypes(*vals, type_promotion_kind=pc.ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[0]


_BINARY = {
    aten.add.Tensor: (BO.ADD, "AddOptions"), aten.add.Scalar: (BO.ADD, "AddOptions"),
    aten.sub.Tensor: (BO.SUB, "SubOptions"), aten.sub.Scalar: (BO.SUB, "SubOptions"),
    aten.mul.Tensor: (BO.MUL, "MulOptions"), aten.mul.Scalar: (BO.MUL, "MulOptions"),
    aten.div.Tensor: (BO.DIV, "DivOptions"), aten.div.Scalar: (BO.DIV, "DivOptions"),
    aten.maximum.default: (BO.MAXIMUM, None), aten.minimum.default: (BO.MINIMUM, None),
    aten.pow.Tensor_Tensor: (BO.POW, None),
}


@lowering(*_BINARY)
def binary(ctx, node):
    code, opt = _BINARY[node.target]
    args = arguments(node)
    a, b = args[0], args[1]
    alpha = args[2] if node.target in (aten.add.Tensor, aten.sub.Tensor, aten.add.Scalar, aten.sub.Scalar) else 1
    dt = ctx.dtype(node)
    if node.target in (aten.div.Tensor, aten.div.Scalar):
        mode = node.kwargs.get("rounding_mode")
        if mode is not None:
            raise ctx.error(f"div with rounding_mode={mode!r} is not supported")
    ta, tb = operand(ctx, a, dt), operand(ctx, b, dt)
    if alpha != 1:
        scaled = ctx.like(b, "alpha", dt) if isinstance(b, fx.Node) else ctx.new_tensor([], dt, "alpha")
        ctx.op(BO.MUL, [tb, ctx.tensor(alpha, dt)], [scaled], options("MulOptions"))
        tb = scaled
    ctx.op(code, [ta, tb], [ctx.output(node)], options(opt) if opt else None)


@lowering(aten.rsub.Scalar, aten.rsub.Tensor)
def rsub(ctx, node):
    args = arguments(node)
    a, b, alpha = args[0], args[1], args[2]
    if alpha != 1:
        raise ctx.error("rsub with alpha != 1 is not supported")
    dt = ctx.dtype(node)
    ctx.op(BO.SUB, [operand(ctx, b, dt), operand(ctx, a, dt)], [ctx.output(node)], options("SubOptions"))


_UNARY = {
    aten.neg.default: BO.NEG, aten.exp.default: BO.EXP, aten.log.default: BO.LOG,
    aten.sqrt.default: BO.SQRT, aten.rsqrt.default: BO.RSQRT, aten.sin.default: BO.SIN,
    aten.cos.default: BO.COS, aten.tanh.default: BO.TANH, aten.abs.default: BO.ABS,
    aten.sigmoid.default: BO.LOGISTIC, aten.relu.default: BO.RELU,
    aten.logical_not.default: BO.LOGICAL_NOT, aten.floor.default: BO.FLOOR, aten.round.default: BO.ROUND,
}


@lowering(*_UNARY)
def unary(ctx, node):
    x = node.args[0]
    dt = ctx.dtype(node)
    ctx.op(_UNARY[node.target], [operand(ctx, x, dt)], [ctx.output(node)])


@lowering(aten.ceil.default, aten.trunc.default)
def ceil_trunc(ctx, node):
    """Through FLOOR, exact in onert 0.1.0: ``ceil(x) = -floor(-x)``; ``trunc(x)`` is
    ``ceil`` where ``x < 0``, else ``floor`` (one float SELECT_V2 of same-shaped operands)."""
    dt = ctx.dtype(node)
    x = operand(ctx, node.args[0], dt)
    neg, floor_neg, ceil = ctx.like(node, "neg"), ctx.like(node, "floor_neg"), ctx.like(node, "ceil")
    ctx.op(BO.NEG, [x], [neg])
    ctx.op(BO.FLOOR, [neg], [floor_neg])
    if node.target is aten.ceil.default:
        ctx.op(BO.NEG, [floor_neg], [ctx.output(node)])
        return
    ctx.op(BO.NEG, [floor_neg], [ceil])
    floor = ctx.like(node, "floor")
    ctx.op(BO.FLOOR, [x], [floor])
    negative = ctx.like(node, "negative", torch.bool)
    ctx.op(BO.LESS, [x, ctx.tensor(0.0, dt)], [negative])
    ctx.op(BO.SELECT_V2, [negative, ceil, floor], [ctx.output(node)])


@lowering(aten.silu.default)
def silu(ctx, node):
    x = ctx.tensor(node.args[0])
    sig = ctx.like(node, "sigmoid")
    ctx.op(BO.LOGISTIC, [x], [sig])
    ctx.op(BO.MUL, [x, sig], [ctx.output(node)], options("MulOptions"))


@lowering(aten.gelu.default)
def gelu(ctx, node):
    approximate = arguments(node)[1]
    ctx.op(BO.GELU, [ctx.tensor(node.args[0])], [ctx.output(node)],
           options("GeluOptions", approximate=(approximate == "tanh")))


@lowering(aten.leaky_relu.default)
def leaky_relu(ctx, node):
    """LEAKY_RELU (exact in onert 0.1.0: ``x if x > 0 else alpha * x``, one rounding as torch's);
    it was GREATER + MUL + SELECT_V2 through torch's decomposition, which the layout pass does
    not carry a permute through (a vocoder's every 1-D convolution then kept its TRANSPOSEs)."""
    slope = arguments(node)[1]
    ctx.op(BO.LEAKY_RELU, [ctx.tensor(node.args[0])], [ctx.output(node)],
           options("LeakyReluOptions", alpha=float(slope)))


@lowering(aten.reciprocal.default)
def reciprocal(ctx, node):
    dt = ctx.dtype(node)
    ctx.op(BO.DIV, [ctx.tensor(1.0, dt), operand(ctx, node.args[0], dt)], [ctx.output(node)], options("DivOptions"))


@lowering(aten.square.default)
def square(ctx, node):
    """``x * x`` for every type, the form ``pow(x, 2)`` takes too (float squares arrive as ``pow``
    anyway). A SQUARE of integers, which onert 0.1.0 does not run (the op table's SQUARE row), is
    legalized to this MUL by the ``types`` step (emit/legalize/types.py)."""
    tx = operand(ctx, node.args[0], ctx.dtype(node))
    ctx.op(BO.MUL, [tx, tx], [ctx.output(node)], options("MulOptions"))


@lowering(aten.pow.Tensor_Scalar)
def pow_scalar(ctx, node):
    x, e = node.args[0], node.args[1]
    dt = ctx.dtype(node)
    tx = operand(ctx, x, dt)
    if e == 2:
        ctx.op(BO.MUL, [tx, tx], [ctx.output(node)], options("MulOptions"))
    elif e == 0.5:
        ctx.op(BO.SQRT, [tx], [ctx.output(node)])
    elif e == -0.5:
        ctx.op(BO.RSQRT, [tx], [ctx.output(node)])
    else:
        ctx.op(BO.POW, [tx, ctx.tensor(e, dt)], [ctx.output(node)])


_COMPARE = {
    aten.lt.Tensor: BO.LESS, aten.lt.Scalar: BO.LESS, aten.le.Tensor: BO.LESS_EQUAL,
    aten.le.Scalar: BO.LESS_EQUAL, aten.gt.Tensor: BO.GREATER, aten.gt.Scalar: BO.GREATER,
    aten.ge.Tensor: BO.GREATER_EQUAL, aten.ge.Scalar: BO.GREATER_EQUAL,
    aten.eq.Tensor: BO.EQUAL, aten.eq.Scalar: BO.EQUAL, aten.ne.Tensor: BO.NOT_EQUAL,
    aten.ne.Scalar: BO.NOT_EQUAL,
}


@lowering(*_COMPARE)
def compare(ctx, node):
    a, b = node.args[0], node.args[1]
    dt = compute_dtype(node, a, b)
    ctx.op(_COMPARE[node.target], [operand(ctx, a, dt), operand(ctx, b, dt)], [ctx.output(node)])


_LOGICAL = {
    aten.logical_and.default: BO.LOGICAL_AND, aten.logical_or.default: BO.LOGICAL_OR,
    aten.bitwise_and.Tensor: BO.LOGICAL_AND, aten.bitwise_or.Tensor: BO.LOGICAL_OR,
    aten.__and__.Tensor: BO.LOGICAL_AND, aten.__or__.Tensor: BO.LOGICAL_OR,
}


def _refused_bitwise(info, node) -> str | None:
    """onert's LOGICAL_* ops take bool tensors only."""
    if info.dtype(node) != torch.bool:
        return f"bitwise ops are only supported on bool tensors, got {info.dtype(node)}"
    return None


@lowering(*_LOGICAL, refuses=_refused_bitwise)
def logical(ctx, node):
    a, b = node.args[0], node.args[1]
    ctx.op(_LOGICAL[node.target], [operand(ctx, a, torch.bool), operand(ctx, b, torch.bool)], [ctx.output(node)])


@lowering(aten.bitwise_not.default, refuses=_refused_bitwise)
def bitwise_not(ctx, node):
    """``~mask`` on a bool tensor (DeepSeek-V3's group-limited router) is LOGICAL_NOT."""
    ctx.op(BO.LOGICAL_NOT, [ctx.tensor(node.args[0])], [ctx.output(node)])


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(ctx, node):
    """SELECT_V2, for values of any type. onert 0.1.0 selects float values only; the ``types``
    legalization step rewrites an integer or bool one (``emit/legalize/types.py``). Gemma3n masks
    out-of-range token ids this way; MoE routers select expert indices."""
    cond, a, b = node.args[0], node.args[1], node.args[2]
    dt = ctx.dtype(node)
    ctx.op(BO.SELECT_V2, [operand(ctx, cond, torch.bool), operand(ctx, a, dt), operand(ctx, b, dt)], [ctx.output(node)])


@lowering(aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.type_as.default)
def cast(ctx, node):
    """A dtype change (a same-dtype copy is a no-op, which Canonicalize removed: ``emit``'s
    input contract)."""
    ctx.op(BO.CAST, [ctx.tensor(node.args[0])], [ctx.output(node)])
