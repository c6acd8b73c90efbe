"""Shape and layout ops: reshape family -> RESHAPE, transpose/permute -> TRANSPOSE,
expand -> BROADCAST_TO, slice/select -> STRIDED_SLICE, cat -> CONCATENATION.

Shape operands are int32 constants: onert rejects int64 shape/perm/begin tensors.
"""
from __future__ import annotations

import operator

import numpy as np
import torch

from ...circle import limits
from ...circle.dims import padded
from ...fx_utils import arguments
from ..registry import lowering
from ._common import BO, options

aten = torch.ops.aten
INT32_MAX = 2**31 - 1


@lowering(aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unsqueeze.default,
          aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.flatten.using_ints,
          aten.unflatten.int)
def reshape(ctx, node):
    ctx.op(BO.RESHAPE, [ctx.tensor(node.args[0]), ctx.shape_operand(node)], [ctx.output(node)])


def _transpose(ctx, node, perm):
    """TRANSPOSE, of any element type: onert 0.1.0 transposes float32 and int32 only, and the
    ``types`` legalization step brings the others within that (a RESHAPE when only size-1 dims
    move, bool through int32, int64 constants stored as int32; a run-time int64 / int8 transpose
    that moves data is refused there, naming the op and the model line)."""
    ctx.op(BO.TRANSPOSE, [ctx.tensor(node.args[0]), ctx.int_const(perm, "perm")], [ctx.output(node)])


@lowering(aten.transpose.int)
def transpose(ctx, node):
    rank = ctx.rank(node.args[0])
    a, b = node.args[1] % rank, node.args[2] % rank
    perm = list(range(rank))
    perm[a], perm[b] = perm[b], perm[a]
    _transpose(ctx, node, perm)


@lowering(aten.permute.default)
def permute(ctx, node):
    rank = ctx.rank(node.args[0])
    _transpose(ctx, node, [d % rank for d in node.args[1]])


@lowering(aten.t.default, aten.numpy_T.default)
def t(ctx, node):
    rank = ctx.rank(node.args[0])
    _transpose(ctx, node, list(reversed(range(rank))))


@lowering(aten.expand.default, aten.expand_as.default, aten.broadcast_to.default)
def expand(ctx, node):
    if ctx.is_dynamic(node.args[0]) or ctx.is_dynamic(node):
        _expand_dynamic(ctx, node)
        return
    src, out = ctx.dims(node.args[0], static=True), ctx.dims(node, static=True)
    x = ctx.tensor(node.args[0])
    if src == out:
        ctx.op(BO.RESHAPE, [x, ctx.int_const(out)], [ctx.output(node)])
        return
    if len(out) > limits.BROADCAST_TO:  # no rank-padding RESHAPE: the ranks step folds it in
        ctx.op(BO.BROADCAST_TO, [x, ctx.int_const(out)], [ctx.output(node)])
        return
    if len(src) < len(out):  # leading new dims: make ranks equal first
        src = padded(src, len(out))
        x = ctx.reshaped(x, src, name="rank")
    if ctx.dtype(node) == torch.bool and len(out) <= limits.LOGICAL_BROADCAST:
        # OR with a False constant of the repeated sizes broadcasts a bool in one op (BROADCAST_TO
        # has no bool kernel: the types step would CAST through int32). Not above rank
        # LOGICAL_BROADCAST, where onert's broadcasting LOGICAL_OR is wrong: BROADCAST_TO there.
        zeros = ctx.const(np.zeros([o if s == 1 else 1 for s, o in zip(src, out)], np.bool_), "broadcast")
        ctx.op(BO.LOGICAL_OR, [x, zeros], [ctx.output(node)])
        return
    ctx.op(BO.BROADCAST_TO, [x, ctx.int_const(out)], [ctx.output(node)])


def _expand_dynamic(ctx, node):
    """``expand`` with dynamic dims, as TILE: BROADCAST_TO needs the full output shape as a
    constant, TILE only per-dim multiples, and a dynamic dim that is not expanded has
    multiple 1 (e.g. ``repeat_kv``'s ``[b, kv, 1, seq, d] -> [b, kv, n, seq, d]``)."""
    x = node.args[0]
    src_sig, out_sig = ctx.dims(x), ctx.dims(node)
    t = ctx.tensor(x)
    if len(src_sig) < len(out_sig):  # leading new dims: make ranks equal first
        sig = padded(src_sig, len(out_sig))
        t, src_sig = ctx.reshaped(t, sig, padded(ctx.shape_hint(x), len(out_sig)), "rank"), sig
    multiples = []
    for d, (a, b) in enumerate(zip(src_sig, out_sig)):
        if a == b:
            multiples.append(1)
        elif a == 1 and b != -1:
            multiples.append(b)
        else:
            raise ctx.error(f"expanding dim {d} from {a} to {b} (-1 = dynamic) needs the size at run time, "
                            "which is not supported")
    if all(m == 1 for m in multiples):  # e.g. mask.expand(b, -1, q, kv) with nothing to repeat:
        ctx.bind(node, t)  # no op (onert's TILE has no bool/int kernel)
        return
    # plain TILE for every type: the ``types`` legalization step broadcasts a non-float one
    # (onert's TILE is float only) against zeros (emit/legalize/types.py)
    ctx.op(BO.TILE, [t, ctx.int_const(multiples, "multiples")], [ctx.output(node)])


@lowering(aten.slice.Tensor)
def slice_(ctx, node):
    x, dim, start, end, step = arguments(node)
    if ctx.is_dynamic(x):
        _slice_dynamic(ctx, node, x, dim, start, end, step)
        return
    shape = ctx.dims(x, static=True)
    rank = len(shape)
    dim %= rank
    size = shape[dim]
    start = 0 if start is None else start
    end = size if end is None else end
    start = max(0, min(size, start + size if start < 0 else start))
    end = max(start, min(size, end + size if end < 0 else end))
    begin = [0] * rank
    ends = list(shape)
    strides = [1] * rank
    begin[dim], ends[dim], strides[dim] = start, end, step
    ctx.op(BO.STRIDED_SLICE, [ctx.tensor(x), ctx.int_const(begin, "begin"), ctx.int_const(ends, "end"),
                              ctx.int_const(strides, "strides")], [ctx.output(node)],
           options("StridedSliceOptions"))


def _slice_dynamic(ctx, node, x, dim, start, end, step):
    """STRIDED_SLICE on a tensor with dynamic dims: untouched axes use the end mask (their
    size is unknown here); the sliced axis keeps torch's indices, negative ones included,
    which STRIDED_SLICE resolves against the run-time size."""
    sig = ctx.dims(x)
    rank = len(sig)
    dim %= rank
    for v in (start, end, step):
        if v is not None and not isinstance(v, int):
            raise ctx.error(f"slice bounds that depend on a dynamic size ({v}) are not supported")
    start = 0 if start is None else start
    mask = ((1 << rank) - 1) & ~(1 << dim)
    if end is None or end >= INT32_MAX:
        mask |= 1 << dim
        end = 0
    elif sig[dim] != -1:
        end = max(start, min(sig[dim], end + sig[dim] if end < 0 else end))
    begin, ends, strides = [0] * rank, [0] * rank, [1] * rank
    begin[dim], ends[dim], strides[dim] = max(-INT32_MAX, start), end, step
    ctx.op(BO.STRIDED_SLICE, [ctx.tensor(x), ctx.int_const(begin, "begin"), ctx.int_const(ends, "end"),
                              ctx.int_const(strides, "strides")], [ctx.output(node)],
           options("StridedSliceOptions", beginMask=0, endMask=mask))


@lowering(aten.select.int)
def select(ctx, node):
    x, dim, index = node.args
    shape = ctx.dims(x, static=True)
    rank = len(shape)
    dim %= rank
    index = index + shape[dim] if index < 0 else index
    begin, ends, strides = [0] * rank, list(shape), [1] * rank
    begin[dim], ends[dim] = index, index + 1
    ctx.op(BO.STRIDED_SLICE, [ctx.tensor(x), ctx.int_const(begin, "begin"), ctx.int_const(ends, "end"),
                              ctx.int_const(strides, "strides")], [ctx.output(node)],
           options("StridedSliceOptions", shrinkAxisMask=1 << dim))


@lowering(aten.cat.default, aten.concat.default)
def cat(ctx, node):
    tensors = [t for t in node.args[0] if ctx.dims(t) and 0 not in ctx.dims(t)]
    dim = arguments(node)[1]
    rank = ctx.rank(node)
    ctx.op(BO.CONCATENATION, [ctx.tensor(t) for t in tensors], [ctx.output(node)],
           options("ConcatenationOptions", axis=dim % rank))


@lowering(operator.getitem)
def getitem(ctx, node):
    src, i = node.args
    ctx.bind(node, ctx.item(src, i))


@lowering(aten.split_with_sizes.default, aten.split.Tensor, aten.chunk.default)
def split(ctx, node):
    """Equal pieces: one SPLIT; otherwise one SLICE per piece: onert 0.1.0's SPLIT_V returns all-zero
    outputs (measured), SPLIT and SLICE are exact.
    The piece sizes come from the traced outputs (the last may be short); dynamic dims get
    SLICE size -1 (to the end)."""
    x, _, dim = arguments(node)[:3]
    dim %= ctx.rank(x)
    shape = ctx.dims(x)
    if shape[dim] == -1:
        raise ctx.error(f"splitting along dynamic dim {dim} of %{x.name} {shape} is not supported")
    src = ctx.tensor(x)
    outs = ctx.outputs(node)
    sizes = [ctx.dims(node, item=k)[dim] for k in range(len(outs))]
    if len(sizes) > 1 and len(set(sizes)) == 1 and sizes[0] * len(sizes) == shape[dim]:
        # equal pieces: one SPLIT (exact in onert 0.1.0, unlike SPLIT_V) instead of n SLICEs
        ctx.op(BO.SPLIT, [ctx.int_const(dim, "axis"), src], outs, options("SplitOptions", numSplits=len(sizes)))
        return
    start = 0
    for k, out in enumerate(outs):
        size = ctx.dims(node, item=k)[dim]
        begin, extent = [0] * len(shape), list(shape)
        begin[dim], extent[dim] = start, size
        ctx.op(BO.SLICE, [src, ctx.int_const(begin, "begin"), ctx.int_const(extent, "size")], [out],
               options("SliceOptions"))
        start += size
