"""Advanced indexing ``x[idx]`` (``aten.index.Tensor``) with one index tensor -> GATHER.

MoE layers pick expert weights this way (``gate_up_proj[expert_ids]``). One index
tensor at dimension d, every other position ``None`` (a full slice), is exactly
GATHER on axis d; several index tensors (broadcast together) would need GATHER_ND,
which onert 0.1.0 does not implement: ``passes/flat_index.py`` rewrites them into one
flat index before emission, so only cases it cannot (symbolic shapes) reach this error.
onert's GATHER has no bool kernel: a bool table is gathered as int32 and cast back.

torch counts negative indices from the end; GATHER reads out of bounds instead. Constant
index tensors are wrapped at compile time; a run-time index tensor gets
``idx + size * (idx < 0)`` (onert's SELECT_V2 has no int64 kernel) unless it comes straight from an op whose result
is a position and so never negative (``topk``/``sort``/``max.dim`` indices, ``argmax``,
possibly reshaped or sliced on the way):
that is the MoE router case, which then costs no extra ops.
"""
from __future__ import annotations

import operator

import numpy as np
import torch

from ...fx_utils import look_through
from ..registry import lowering
from ..types import to_numpy
from ._common import BO, options

aten = torch.ops.aten


@lowering(aten.index.Tensor)
def index(ctx, node):
    x, indices = node.args[0], node.args[1]
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) != 1:
        raise ctx.error(f"indexing with {len(given)} index tensors is not supported (only one; "
                        "onert has no GATHER_ND)")
    axis, idx = given[0]
    if ctx.dtype(idx) == torch.bool:
        raise ctx.error("boolean-mask indexing has a data-dependent shape and is not supported")
    table, out, idx = ctx.tensor(x), ctx.output(node), _index(ctx, x, axis, idx)
    if ctx.dtype(x) == torch.bool:  # onert 0.1.0 GATHER: "unsupported input data type" for bool
        table = ctx.like(x, "as_int32", torch.int32)
        ctx.op(BO.CAST, [ctx.tensor(x)], [table])
        out = ctx.like(node, "gathered_int32", torch.int32)
    ctx.op(BO.GATHER, [table, idx], [out], options("GatherOptions", axis=axis, batchDims=0))
    if out != ctx.output(node):
        ctx.op(BO.CAST, [out], [ctx.output(node)])


#: ops whose (index) result is a position, never negative: (op, tuple element or None)
_POSITIONS = {(aten.topk.default, 1), (aten.sort.default, 1), (aten.max.dim, 1), (aten.min.dim, 1),
              (aten.argmax.default, None), (aten.argmin.default, None)}


#: ops that move or repeat values without changing them (non-negativity carries through)
_SAME_VALUES = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default,
                aten.squeeze.dim, aten.squeeze.dims, aten.flatten.using_ints, aten.transpose.int,
                aten.permute.default, aten.expand.default, aten.slice.Tensor, aten.select.int}


def _never_negative(idx) -> bool:
    idx = look_through(idx)
    while idx.op == "call_function" and idx.target in _SAME_VALUES:
        idx = look_through(idx.args[0])
    if idx.op == "call_function" and idx.target is operator.getitem:
        src, i = idx.args
        return (getattr(src, "target", None), i) in _POSITIONS
    return (getattr(idx, "target", None), None) in _POSITIONS


def _index(ctx, x, axis, idx):
    """The index tensor with negative entries wrapped (see the module docstring)."""
    size = ctx.shape_hint(x)[axis]
    dynamic = ctx.dims(x)[axis] == -1
    t = ctx.constant(idx)
    if t is not None:
        if not bool((t < 0).any()):
            return ctx.tensor(idx)
        if dynamic:
            raise ctx.error(f"negative indices into dynamic dim {axis} of %{x.name} are not supported")
        return ctx.const(to_numpy(torch.where(t < 0, t + size, t)), "index")
    if _never_negative(idx):
        return ctx.tensor(idx)
    if dynamic:
        raise ctx.error(f"run-time indices into dynamic dim {axis} of %{x.name} may be negative, which "
                        "cannot be wrapped without the dim's size; index a static dim instead")
    dt = ctx.dtype(idx)
    raw = ctx.tensor(idx)
    zero = ctx.const(np.array(0, dtype=to_numpy(torch.zeros((), dtype=dt)).dtype), "zero")
    negative = ctx.like(idx, "negative", torch.bool)
    ctx.op(BO.LESS, [raw, zero], [negative])
    as_int = ctx.like(idx, "negative_int")
    ctx.op(BO.CAST, [negative], [as_int])
    offset = ctx.like(idx, "offset")
    ctx.op(BO.MUL, [as_int, ctx.tensor(size, dt)], [offset], options("MulOptions"))
    wrapped = ctx.like(idx, "wrapped")
    ctx.op(BO.ADD, [raw, offset], [wrapped], options("AddOptions"))
    return wrapped
