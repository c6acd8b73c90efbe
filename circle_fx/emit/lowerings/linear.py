"""Matrix products: ``linear`` -> FULLY_CONNECTED, 1x1 CONV_2D or BATCH_MATMUL (whichever
onert runs fastest, see :mod:`circle_fx.emit.linear_form`), ``matmul``/``bmm`` -> BATCH_MATMUL
(any rank: the ``ranks`` legalization step folds batch dims into the ranks onert runs),
``embedding`` -> GATHER.

FULLY_CONNECTED and CONV_2D take torch's ``[out, in]`` weight as is (CONV_2D as the same
bytes viewed ``[out, 1, 1, in]``), so those weights need no transpose at compile time or run
time; BATCH_MATMUL gets the weight transposed once, at compile time. onert's
FULLY_CONNECTED returns ``[rows, out]`` whatever ``keep_num_dims`` says and needs a bias
slot (-1 when absent), so N-D inputs get a RESHAPE after it. Weights that are not
constants go through BATCH_MATMUL instead.

``circle.linear_act`` (the ``linear_activation`` family: a linear then ReLU / ReLU6) takes the
same forms with the activation fused into the operator that writes the result: the
FULLY_CONNECTED, the 1x1 CONV_2D, or the bias ADD after BATCH_MATMUL (a zero bias when the
linear has none: BATCH_MATMUL has no fused activation).
"""
from __future__ import annotations

import math

import torch

from ...fx_utils import arguments
from ...fusions.linear_activation import linear_act
from ..registry import lowering
from .. import linear_form
from ._common import ACTIVATION, BO, options
from ._fc import fully_connected, rows_input
from ._matmul import batch_matmul

aten = torch.ops.aten
PADDING_VALID = 1  # circle.Padding.Padding.VALID


def _refused_vector_weight(info, node) -> str | None:
    """A 1-D weight (``F.linear(x, w[K])``: a dot product that drops the last dim, D-FINE's
    box-distribution projection) is not a matrix: the decomposition gives it one row."""
    w = arguments(node)[1]
    v = getattr(w, "meta", {}).get("val")
    return "a 1-D weight (a dot product over the last dim)" if getattr(v, "dim", lambda: 2)() == 1 else None


@lowering(aten.linear.default, refuses=_refused_vector_weight)
def linear(ctx, node):
    x, w, b = (arguments(node) + [None])[:3]
    if w.op != "get_attr":
        _linear_runtime_weight(ctx, node, x, w, b)
        return
    _linear(ctx, node, x, w, b)


@lowering(linear_act)
def lower_linear_act(ctx, node):
    x, w, b, activation = arguments(node)
    if activation not in ACTIVATION:
        raise ctx.error(f"unknown fused activation {activation!r}; expected one of {sorted(ACTIVATION)}")
    if getattr(w, "op", None) != "get_attr":
        raise ctx.error("the weight of a linear with a fused activation must be a constant")
    _linear(ctx, node, x, w, b, activation)


def _linear(ctx, node, x, w, b, activation="none"):
    out_dims, out_hint = ctx.dims(node), ctx.shape_hint(node)
    if out_dims[:-1].count(-1) > 1:
        _linear_batch_matmul(ctx, node, x, w, b, activation)
        return
    rows = math.prod(out_hint[:-1])
    # a dynamic dim anywhere before the last makes the row count dynamic
    rows_dim = -1 if -1 in out_dims[:-1] else rows
    form = _form(ctx, node, w, rows if rows_dim != -1 else None)
    if form == linear_form.CONV_2D:
        _linear_conv(ctx, node, x, w, b, rows, activation)
        return
    if form == linear_form.BATCH_MATMUL:
        _linear_batch_matmul(ctx, node, x, w, b, activation)
        return
    fully_connected(ctx, node, rows_input(ctx, x), ctx.tensor(w), ctx.tensor(b) if b is not None else -1,
                    activation=activation)


def _form(ctx, node, w, rows):
    """The op form for this linear: forced by an annotation (static rows only), FULLY_CONNECTED
    for quantized weights (the only form with a measured hybrid int8 kernel), else
    :func:`linear_form.choose`."""
    forced = ctx.annotation(node, linear_form.META_KEY)
    if forced is not None:
        if forced not in linear_form.FORMS:
            raise ctx.error(f"meta[{linear_form.META_KEY!r}] = {forced!r}; expected one of {linear_form.FORMS}")
        return forced if rows is not None else linear_form.FULLY_CONNECTED
    if ctx.quantization(w) is not None:
        return linear_form.FULLY_CONNECTED
    out_f, in_f = ctx.dims(w, static=True)
    return linear_form.choose(rows, in_f, out_f, shared=ctx.shared_weights)


def _linear_conv(ctx, node, x, w, b, rows, activation="none"):
    """``x`` as ``[1, rows, 1, in]`` through a 1x1 CONV_2D whose filter is the weight's bytes
    viewed ``[out, 1, 1, in]`` (OHWI; no copy, no transpose); onert needs an explicit bias."""
    weight = ctx.constant(w).detach()
    out_f, in_f = weight.shape
    x4 = ctx.new_tensor([1, rows, 1, in_f], ctx.dtype(x), "in4d")
    ctx.op(BO.RESHAPE, [ctx.tensor(x), ctx.int_const([1, rows, 1, in_f])], [x4])
    filt = ctx.const_tensor(weight.reshape(out_f, 1, 1, in_f), w.target)
    bias = ctx.tensor(b) if b is not None else ctx.const(torch.zeros(out_f, dtype=weight.dtype).numpy(), "zero_bias")
    y4 = ctx.new_tensor([1, rows, 1, out_f], ctx.dtype(node), "conv")
    ctx.op(BO.CONV_2D, [x4, filt, bias], [y4],
           options("Conv2DOptions", padding=PADDING_VALID, strideW=1, strideH=1, dilationWFactor=1,
                   dilationHFactor=1, fusedActivationFunction=ACTIVATION[activation]))
    ctx.op(BO.RESHAPE, [y4, ctx.shape_operand(node)], [ctx.output(node)])


def _linear_batch_matmul(ctx, node, x, w, b, activation="none"):
    """Several dynamic leading dims: FULLY_CONNECTED would flatten them and the RESHAPE back
    could infer only one, so multiply by the transposed weight with BATCH_MATMUL instead
    (rank-broadcast ``[..., in] x [in, out]``) and add the bias (a fused activation rides on
    that ADD; zeros when there is no bias)."""
    weight = ctx.constant(w).detach()
    wt = ctx.const(weight.t().contiguous().numpy(), "weight_T")
    if activation == "none":
        _matmul_plus_bias(ctx, node, x, wt, b)
        return
    mm = ctx.like(node, "mm")
    batch_matmul(ctx, ctx.tensor(x), wt, mm)
    bias = ctx.tensor(b) if b is not None else ctx.const(torch.zeros(weight.shape[0], dtype=weight.dtype).numpy(),
                                                          "zero_bias")
    ctx.op(BO.ADD, [mm, bias], [ctx.output(node)],
           options("AddOptions", fusedActivationFunction=ACTIVATION[activation]))


def _linear_runtime_weight(ctx, node, x, w, b):
    wshape = ctx.dims(w, static=True)
    wt = ctx.new_tensor([wshape[1], wshape[0]], ctx.dtype(w), "wT")
    ctx.op(BO.TRANSPOSE, [ctx.tensor(w), ctx.int_const([1, 0], "perm")], [wt])
    _matmul_plus_bias(ctx, node, x, wt, b)


def _matmul_plus_bias(ctx, node, x, wt, b):
    """``x @ wt`` (``wt`` is the ``[in, out]`` weight tensor) with BATCH_MATMUL, then ADD the bias."""
    out = ctx.output(node) if b is None else ctx.like(node, "mm")
    batch_matmul(ctx, ctx.tensor(x), wt, out)
    if b is not None:
        ctx.op(BO.ADD, [out, ctx.tensor(b)], [ctx.output(node)], options("AddOptions"))


@lowering(aten.matmul.default, aten.bmm.default, aten.mm.default)
def matmul(ctx, node):
    """Any ranks, 1-D included (:func:`batch_matmul`; the ``ranks`` step folds batch dims)."""
    a, b = node.args[0], node.args[1]
    if ctx.rank(a) == 1 and ctx.rank(b) == 1:
        raise ctx.error("matmul of two 1-D operands (a dot product) is not supported")
    batch_matmul(ctx, ctx.tensor(a), ctx.tensor(b), ctx.output(node))


@lowering(aten.embedding.default)
def embedding(ctx, node):
    weight, indices = node.args[0], node.args[1]
    ctx.op(BO.GATHER, [ctx.tensor(weight), ctx.tensor(indices)], [ctx.output(node)],
           options("GatherOptions", axis=0, batchDims=0))


@lowering(aten.index_select.default)
def index_select(ctx, node):
    x, dim, index = node.args
    dim = dim % ctx.rank(x)
    ctx.op(BO.GATHER, [ctx.tensor(x), ctx.tensor(index)], [ctx.output(node)],
           options("GatherOptions", axis=dim, batchDims=0))
