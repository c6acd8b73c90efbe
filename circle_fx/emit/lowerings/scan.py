"""``arange`` over a dynamic length, ``cumsum`` and ``diff``: prefix sums built from ops onert has.

A transformers decoder exported with a dynamic sequence length and only ``input_ids``
computes its position ids (``arange(seq)``) and its causal mask (``arange`` compared with
``arange``, plus a packed-sequence check with ``diff`` and ``cumsum``) at run time. onert
0.1.0 has no RANGE or CUMSUM kernel, and fails on ops whose output *shape* comes from a
run-time *value* (a SLICE of a constant table with the size taken from SHAPE, FILL from
SHAPE: docs/onert-findings.md §4). So neither can be built from the length as a number.

What works is to derive everything from a tensor that already has the run-time shape:

* ``ones``: ``x == x or x != x`` on a slice of the input that carries the dynamic dim
  (true for every value, NaN included), cast to int32;
* an inclusive prefix sum by log-step doubling (Hillis-Steele): ``ceil(log2(max))`` times
  ``y += shift(y, 2**k)``, where the shift puts ``2**k`` zeros in front (CONCATENATION
  with a constant, or PAD) and a STRIDED_SLICE drops as many at the end (its end is the constant ``-2**k``, which
  STRIDED_SLICE resolves against the run-time size). All shapes follow the input's.
* ``arange(start, start + n) = start + cumsum(ones(n)) - 1``.

The doubling is exact for lengths up to ``2**steps``, so it needs the dim's upper bound
(``Dim("seq", max=...)``): without one the error names the dim, and the model records
the bound so that ``CircleModel.run`` rejects a longer input (``InputError``).
"""
from __future__ import annotations

import math
import weakref

import numpy as np
import torch
import torch.fx as fx

from ...fx_utils import arguments, val
from ..registry import lowering
from ..types import numpy_dtype
from ._common import BO, operand, options

aten = torch.ops.aten


# ----------------------------------------------------------------- sizes and bounds
def _input_dim_for(ctx, size: torch.SymInt):
    """``(model input, dim)`` whose size is ``size``, or None."""
    found = ctx.inputs_with_size(size)
    return found[0] if found else None


def _upper_bound(ctx, sym: torch.SymInt, what: str) -> int:
    """The largest value ``sym`` can take (torch.export's range constraint), or a clear error;
    ``CircleModel.run`` then rejects inputs whose dims exceed it (the lowering is exact
    only up to it)."""
    bound = ctx.size_bound(sym)
    if bound is None:
        found = _input_dim_for(ctx, sym)
        dim = f"dim {found[1]} of input {found[0].name!r}" if found else f"the size {sym.node.expr}"
        raise ctx.error(f"{what} over {dim}, which is dynamic with no upper bound. onert has no RANGE/CUMSUM; "
                        "circle_fx builds them from prefix sums that need the largest size: give that dim a "
                        "maximum, e.g. dynamic_shapes={..: {1: torch.export.Dim('seq', max=2048)}}")
    for n, d in ctx.inputs_with_size(sym):
        ctx.limit_input(n.name, d, bound)
    return bound


def _steps(bound: int) -> int:
    return max(0, math.ceil(math.log2(bound))) if bound > 1 else 0


# ------------------------------------------------------------------------- emitting
def _hint_and_dims(ctx, value):
    """``(example sizes, dims with -1 for dynamic ones or None when all are static)``."""
    dims = ctx.dims(value)
    return ctx.shape_hint(value), (dims if -1 in dims else None)


def _tensor(ctx, hint, dims, dtype, name):
    """An intermediate tensor; ``dims`` (-1 dynamic; None: all static, as ``hint``)."""
    return ctx.new_tensor(dims if dims is not None else hint, dtype, name, hint)


def _pad_front(ctx, x: int, shape, sig, axis: int, m: int, dtype: torch.dtype, name: str) -> int:
    """``x`` with ``m`` zeros in front along ``axis``: CONCATENATION with a zeros constant when
    the other dims are static (one op, no pads table), else PAD. onert's PAD has no integer
    kernel ("Pad: unsupported data type" for int32): the ``types`` legalization step makes an
    integer PAD that same CONCATENATION, and refuses one whose other dims are dynamic."""
    pshape = list(shape)
    pshape[axis] += m
    psig = None if sig is None else [(-1 if s == -1 else p) for s, p in zip(sig, pshape)]
    out = _tensor(ctx, pshape, psig, dtype, name)
    others_static = sig is None or all(s != -1 for d, s in enumerate(sig) if d != axis)
    if others_static and dtype == torch.float32:
        zshape = list(shape)
        zshape[axis] = m
        zeros = ctx.const(np.zeros(zshape, numpy_dtype(dtype)), "zeros")
        ctx.op(BO.CONCATENATION, [zeros, x], [out], options("ConcatenationOptions", axis=axis))
        return out
    pads = np.zeros((len(shape), 2), np.int32)
    pads[axis, 0] = m
    ctx.op(BO.PAD, [x, ctx.int_const(pads, "pads")], [out], options("PadOptions"))
    return out


def _prefix_sum(ctx, x: int, shape, sig, axis: int, steps: int, dtype: torch.dtype) -> int:
    """Inclusive prefix sum of tensor ``x`` along ``axis`` by ``steps`` doublings."""
    rank = len(shape)
    for k in range(steps):
        m = 1 << k
        padded = _pad_front(ctx, x, shape, sig, axis, m, dtype, f"scan{k}_pad")
        begin, end, strides = [0] * rank, [0] * rank, [1] * rank
        end[axis] = -m
        shifted = _tensor(ctx, shape, sig, dtype, f"scan{k}_shift")
        ctx.op(BO.STRIDED_SLICE, [padded, ctx.int_const(begin, "begin"), ctx.int_const(end, "end"),
                                  ctx.int_const(strides, "strides")], [shifted],
               options("StridedSliceOptions", beginMask=0, endMask=((1 << rank) - 1) & ~(1 << axis)))
        y = _tensor(ctx, shape, sig, dtype, f"scan{k}")
        ctx.op(BO.ADD, [x, shifted], [y], options("AddOptions"))
        x = y
    return x


def _ones_along(ctx, src: fx.Node, dim: int) -> tuple[int, list, list]:
    """int32 ones of shape ``[src.shape[dim]]`` computed from ``src`` (so they resize with it)."""
    shape, sig = _hint_and_dims(ctx, src)
    rank = len(shape)
    x = ctx.tensor(src)
    if rank > 1:
        begin, end, strides = [0] * rank, [1] * rank, [1] * rank
        end[dim] = 0
        row = _tensor(ctx, [shape[dim]], [sig[dim]], ctx.dtype(src), "row")
        ctx.op(BO.STRIDED_SLICE, [x, ctx.int_const(begin, "begin"), ctx.int_const(end, "end"),
                                  ctx.int_const(strides, "strides")], [row],
               options("StridedSliceOptions", beginMask=0, endMask=1 << dim,
                       shrinkAxisMask=((1 << rank) - 1) & ~(1 << dim)))
        x = row
    n, s = [shape[dim]], [sig[dim]]
    eq, ne, both = (_tensor(ctx, n, s, torch.bool, nm) for nm in ("same", "differs", "always"))
    ctx.op(BO.EQUAL, [x, x], [eq])
    ctx.op(BO.NOT_EQUAL, [x, x], [ne])
    ctx.op(BO.LOGICAL_OR, [eq, ne], [both])
    ones = _tensor(ctx, n, s, torch.int32, "ones")
    ctx.op(BO.CAST, [both], [ones])
    return ones, n, s


#: per lowering context: (input, dim, steps) -> (counts tensor, shape, signature), so the
#: several ``arange(seq)`` of a transformers model share one prefix sum
_COUNTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _counts_along(ctx, src: fx.Node, dim: int, steps: int):
    """int32 ``1, 2, ..., src.shape[dim]`` (emitted once per context and input dim)."""
    cache = _COUNTS.setdefault(ctx, {})
    key = (src.name, dim, steps)
    if key not in cache:
        ones, shape, sig = _ones_along(ctx, src, dim)
        cache[key] = (_prefix_sum(ctx, ones, shape, sig, 0, steps, torch.int32), shape, sig)
    return cache[key]


def _cast(ctx, x: int, shape, sig, src: torch.dtype, dst: torch.dtype, out: int | None = None) -> int:
    if src == dst and out is None:
        return x
    out = out if out is not None else _tensor(ctx, shape, sig, dst, "cast")
    ctx.op(BO.CAST, [x], [out])
    return out


# ------------------------------------------------------------------------ lowerings
@lowering(aten.arange.default, aten.arange.start)
def arange(ctx, node):
    """``arange`` whose length is a dynamic size (static ones were folded to constants)."""
    args = arguments(node)
    if node.target == aten.arange.default:
        start, end, step = 0, args[0], 1
    else:
        start, end, step = args[0], args[1], 1
    start, end, step = (val(v) if isinstance(v, fx.Node) else v for v in (start, end, step))
    if not isinstance(start, int) or not isinstance(step, int) or step != 1:
        raise ctx.error(f"arange({start}, {end}, {step}): only a dynamic end with a constant start and step 1 "
                        "is supported")
    length = val(node).shape[0]
    if isinstance(length, int):
        raise ctx.error("arange of static length was not folded to a constant")
    found = _input_dim_for(ctx, length)
    if found is None:
        raise ctx.error(f"arange of length {length.node.expr}, which is not the size of any model input's dim")
    bound = _upper_bound(ctx, length, "arange")
    counts, shape, sig = _counts_along(ctx, *found, _steps(bound))
    pos = _tensor(ctx, shape, sig, torch.int32, "positions")
    ctx.op(BO.ADD, [counts, ctx.const(np.array(start - 1, np.int32), "offset")], [pos], options("AddOptions"))
    out_dtype = ctx.dtype(node)
    if out_dtype == torch.int32:
        ctx.bind(node, pos)
    else:
        _cast(ctx, pos, shape, sig, torch.int32, out_dtype, ctx.output(node))


@lowering(aten.cumsum.default)
def cumsum(ctx, node):
    """Prefix sum along ``dim`` in int32 (integers, bools) or float32, cast to the result dtype.
    int64 sums are computed in int32 (onert's int64 support is patchy): exact for counts and
    positions, wrong for sums beyond 2**31. Floats are summed in a tree order, not left to right."""
    x, dim = node.args[0], node.args[1]
    shape, sig = _hint_and_dims(ctx, x)
    axis = dim % len(shape)
    size = val(x).shape[axis]
    bound = size if isinstance(size, int) else _upper_bound(ctx, size, "cumsum")
    work = torch.float32 if ctx.dtype(node).is_floating_point else torch.int32
    t = operand(ctx, x, work)
    t = _prefix_sum(ctx, t, shape, sig, axis, _steps(bound), work)
    if ctx.dtype(node) == work:
        ctx.bind(node, t)
    else:
        _cast(ctx, t, shape, sig, work, ctx.dtype(node), ctx.output(node))


@lowering(aten.diff.default)
def diff(ctx, node):
    """``cat([prepend, x, append])[1:] - [:-1]`` along ``dim`` (n times): slices with constant
    bounds, which STRIDED_SLICE applies to run-time sizes too."""
    x, n, dim, prepend, append = (arguments(node) + [1, -1, None, None])[:5]
    if ctx.dtype(node) == torch.bool:
        raise ctx.error("diff of a bool tensor is not supported")
    rank = ctx.rank(x)
    axis = dim % rank
    parts = [p for p in (prepend, x, append) if p is not None]
    work = ctx.dtype(node)
    shape, sig = _hint_and_dims(ctx, node)
    extra = n  # the concatenation is n longer than the result along axis

    def along(k):
        sh = list(shape)
        sh[axis] += k
        return sh, sig

    cur_shape, cur_sig = along(extra)
    if len(parts) > 1:
        cur = _tensor(ctx, cur_shape, cur_sig, work, "joined")
        ctx.op(BO.CONCATENATION, [operand(ctx, p, work) for p in parts], [cur],
               options("ConcatenationOptions", axis=axis))
    else:
        cur = operand(ctx, x, work)
    for i in range(n):
        nxt_shape, nxt_sig = along(extra - i - 1)
        mask = ((1 << rank) - 1) & ~(1 << axis)
        strides = ctx.int_const([1] * rank, "strides")
        hi = _tensor(ctx, nxt_shape, nxt_sig, work, "hi")
        begin = [0] * rank
        begin[axis] = 1
        ctx.op(BO.STRIDED_SLICE, [cur, ctx.int_const(begin, "begin"), ctx.int_const([0] * rank, "end"), strides],
               [hi], options("StridedSliceOptions", beginMask=0, endMask=mask | (1 << axis)))
        lo = _tensor(ctx, nxt_shape, nxt_sig, work, "lo")
        end = [0] * rank
        end[axis] = -1
        ctx.op(BO.STRIDED_SLICE, [cur, ctx.int_const([0] * rank, "begin"), ctx.int_const(end, "end"), strides],
               [lo], options("StridedSliceOptions", beginMask=0, endMask=mask))
        out = ctx.output(node) if i == n - 1 else _tensor(ctx, nxt_shape, nxt_sig, work, "diff")
        ctx.op(BO.SUB, [hi, lo], [out], options("SubOptions"))
        cur = out


# ------------------------------------------------------------ for other lowerings
def causal_allowed(ctx, q: fx.Node, k: fx.Node, rank: int) -> int:
    """bool ``[1,..,1, Lq, Lk]`` (``rank`` dims): key ``j`` visible from query ``i`` iff ``j <= i``
    (``is_causal=True``'s top-left aligned mask), from the positions of dim -2 of ``q`` and ``k``."""
    def positions(node, name):
        size = val(node).shape[-2]
        if isinstance(size, int):
            counts = ctx.const(np.arange(1, size + 1, dtype=np.int32), f"{name}_counts")
            n, s = [size], [size]
        else:
            bound = _upper_bound(ctx, size, "is_causal=True attention")
            counts, n, s = _counts_along(ctx, node, val(node).dim() - 2, _steps(bound))
        shape = [1] * rank
        sig = [1] * rank
        axis = rank - 2 if name == "q" else rank - 1
        shape[axis], sig[axis] = n[0], s[0]
        out = _tensor(ctx, shape, sig if -1 in sig else None, torch.int32, f"{name}_positions")
        ctx.op(BO.RESHAPE, [counts, ctx.shape_operand(sig)], [out])
        return out, shape, sig

    qp, qshape, qsig = positions(q, "q")
    kp, kshape, ksig = positions(k, "k")
    shape = [1] * (rank - 2) + [qshape[-2], kshape[-1]]
    sig = [1] * (rank - 2) + [qsig[-2], ksig[-1]]
    allowed = _tensor(ctx, shape, sig if -1 in sig else None, torch.bool, "causal")
    ctx.op(BO.LESS_EQUAL, [kp, qp], [allowed])
    return allowed
