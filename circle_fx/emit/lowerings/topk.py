"""``topk`` and ``max.dim`` / ``min.dim`` (values and indices) from REDUCE_MAX and ARG_MAX.

onert 0.1.0 has no TOPK_V2 kernel ("Unsupported operation: TOPK_V2"), so ``topk`` is k
rounds of "take the max and its index, then mask that position with -inf" (EQUAL against
a constant iota + SELECT_V2) and the rounds are concatenated: exact, already sorted
(largest first), and cheap for the small k of MoE routers (k <= 8 typically). Ties go
to the lowest index, as ARG_MAX picks the first. Smallest-k and ``min`` negate first.
Index outputs are only computed when something reads them.

A row may hold fewer than k values above -inf (scores masked with -inf: DeepSeek-V4's
indexer). Masking a picked -inf with -inf changes nothing, so the next ARG_MAX would pick it
again (indices [0, 0] for [0.5, -inf]). With k > 1 the input is therefore first raised to
at least -FLT_MAX (MAXIMUM), so a picked position is always below every unpicked one, and
-FLT_MAX values come back as -inf at the end: exact, except that a value of exactly
-FLT_MAX ties with -inf (and is returned as -inf).
"""
from __future__ import annotations

import operator

import numpy as np
import torch

from ...fx_utils import arguments
from ..registry import lowering
from ..types import circle_type, numpy_dtype
from ._common import BO, options
from .reduce import reduce_into

aten = torch.ops.aten


def _read_outputs(node) -> set[int]:
    return {u.args[1] for u in node.users if u.target is operator.getitem}


def _last_axis(ctx, x, dim) -> tuple[list[int], int]:
    shape = ctx.dims(x, static=True)
    return shape, dim % len(shape)


def _negated(ctx, x, shape, dt):
    neg = ctx.new_tensor(shape, dt, "neg")
    ctx.op(BO.NEG, [ctx.tensor(x)], [neg])
    return neg


def _argmax(ctx, src, shape, axis, out, keepdim):
    """ARG_MAX into ``out`` (int64), reshaped back to keep the reduced axis if asked."""
    reduced = shape[:axis] + shape[axis + 1:]
    target = out if not keepdim else ctx.new_tensor(reduced, torch.int64, "argmax")
    ctx.op(BO.ARG_MAX, [src, ctx.int_const([axis], "axis")], [target],
           options("ArgMaxOptions", outputType=circle_type(ctx.tensor_dtype(out))))
    if keepdim:
        ctx.op(BO.RESHAPE, [target, ctx.int_const(shape[:axis] + [1] + shape[axis + 1:])], [out])


@lowering(aten.max.dim, aten.min.dim)
def max_dim(ctx, node):
    x, dim, keepdim = arguments(node)[:3]
    shape, axis = _last_axis(ctx, x, dim)
    dt = ctx.dtype(x)
    values, indices = ctx.outputs(node, _read_outputs(node))
    src = ctx.tensor(x) if node.target is aten.max.dim else _negated(ctx, x, shape, dt)
    if values is not None:
        red = values if node.target is aten.max.dim else ctx.new_tensor(ctx.tensor_dims(values), dt, "negmax")
        reduce_into(ctx, BO.REDUCE_MAX, src, [axis], bool(keepdim), red)
        if red != values:
            ctx.op(BO.NEG, [red], [values])
    if indices is not None:
        _argmax(ctx, src, shape, axis, indices, bool(keepdim))


@lowering(aten.topk.default)
def topk(ctx, node):
    x, k, dim, largest, _sorted = arguments(node)
    shape, axis = _last_axis(ctx, x, dim)
    if axis != len(shape) - 1:
        raise ctx.error(f"topk over axis {dim} of a {len(shape)}-D tensor is not supported (only the last axis)")
    dt = ctx.dtype(x)
    n = shape[-1]
    values, indices = ctx.outputs(node, _read_outputs(node) or {0})
    cur = ctx.tensor(x) if largest else _negated(ctx, x, shape, dt)
    col = shape[:-1] + [1]
    iota = ctx.const(np.arange(n, dtype=np.int64), "iota")
    ninf = ctx.const(np.array(-np.inf, dtype=numpy_dtype(dt)), "ninf")
    lowest = None
    if k > 1 and dt.is_floating_point:  # see the module docstring: -inf rows
        lowest = ctx.const(np.array(torch.finfo(dt).min, dtype=numpy_dtype(dt)), "lowest")
        raised = ctx.new_tensor(shape, dt, "raised")
        ctx.op(BO.MAXIMUM, [cur, lowest], [raised])
        cur = raised
    vals, idxs = [], []
    for j in range(k):
        v = ctx.new_tensor(col, dt, f"v{j}")
        reduce_into(ctx, BO.REDUCE_MAX, cur, [axis], True, v)
        vals.append(v)
        if indices is None and j == k - 1:
            break
        i = ctx.new_tensor(col, torch.int64, f"i{j}")
        _argmax(ctx, cur, shape, axis, i, keepdim=True)
        idxs.append(i)
        if j == k - 1:
            break
        hit = ctx.new_tensor(shape, torch.bool, f"hit{j}")
        ctx.op(BO.EQUAL, [i, iota], [hit])
        masked = ctx.new_tensor(shape, dt, f"rest{j}")
        ctx.op(BO.SELECT_V2, [hit, ninf, cur], [masked])
        cur = masked
    if values is not None:
        out = values if largest else ctx.new_tensor(ctx.dims(node, item=0), dt, "negtop")
        top = out if lowest is None else ctx.new_tensor(ctx.dims(node, item=0), dt, "top")
        _concat(ctx, vals, top, axis)
        if lowest is not None:  # -FLT_MAX was -inf
            was_inf = ctx.new_tensor(ctx.dims(node, item=0), torch.bool, "was_inf")
            ctx.op(BO.EQUAL, [top, lowest], [was_inf])
            ctx.op(BO.SELECT_V2, [was_inf, ninf, top], [out])
        if out != values:
            ctx.op(BO.NEG, [out], [values])
    if indices is not None:
        _concat(ctx, idxs, indices, axis)


def _concat(ctx, parts, out, axis):
    if len(parts) == 1:
        ctx.op(BO.RESHAPE, [parts[0], ctx.int_const(ctx.tensor_dims(out))], [out])
    else:
        ctx.op(BO.CONCATENATION, parts, [out], options("ConcatenationOptions", axis=axis))
