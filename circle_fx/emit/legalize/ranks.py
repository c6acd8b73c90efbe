"""Operators folded into the ranks onert 0.1.0 computes correctly (the ``ranks`` step).

RMS_NORM of any rank runs as ``[1, rows, D]`` (onert's kernel takes 3-D and 4-D inputs).
Elementwise operators:

Measured (docs/onert-findings.md, "Ranks above 4"):

- SELECT_V2 whose operands broadcast (a scalar, a lower-rank or size-1 operand) returns
  wrong values, without an error, at rank 5 and 6; it is exact at rank <= 4, and at rank
  5-6 when all three operands have the output's shape;
- LOGICAL_OR / LOGICAL_AND likewise: wrong booleans at rank 5-6 with a broadcasting operand,
  exact at rank <= 4 and with operands of the output's shape (``limits.LOGICAL_BROADCAST``);
- every elementwise op tried (EXP, MUL, SUB, SELECT_V2) crashes the process at rank 7.

Any lowering can emit such an operator (``where``, ``masked_fill``, a mask built by
broadcasting...), so the fix is here, on the emitted operators, before the peephole pass:
positions where the output has size 1 are dropped, and consecutive positions where every
operand broadcasts the same way (each operand is either 1 or full there) are multiplied
into one dim. RESHAPE in, the op on the folded shapes, RESHAPE out: exact, since row-major
order is unchanged (the peephole then merges back-to-back RESHAPEs between folded ops).
Operators onert already computes correctly are left as they are.

MEAN / SUM / REDUCE_MAX and STRIDED_SLICE above their ranks: :mod:`.axes`.

BATCH_MATMUL above rank 4 (refused at prepare), BROADCAST_TO above rank 5 (wrong values at 6,
a crash at 7): neighbouring batch / broadcast positions that behave alike are multiplied into
one dim, as for elementwise operators (:func:`_fold_batch_matmul`, :func:`_fold_broadcast_to`).

DEPTHWISE_CONV_2D deeper than ``limits.DEPTHWISE_DEPTH`` channels (onert never returns) runs
as channel slices: STRIDED_SLICE of the input per slice, one DEPTHWISE_CONV_2D on the matching
filter and bias columns, a CONCATENATION along channels. Depthwise channels are independent,
so this is exact (Kimi-Linear's short convolution over q, k and v is 12288 deep).
"""
from __future__ import annotations

import numpy as np

from ...circle import dims, limits, op_table
from ...circle.limits import elementwise_max_rank
from ...circle.schema import QuantParams, make_options as options
from ..builder import BO, ModelBuilder, OperatorInfo, op_name
from . import axes

def legalize(mb: ModelBuilder) -> int:
    """Fold every operator above its rank limit (:data:`FOLDS`), in place; return how many."""
    return mb.rewrite_operators(lambda op: _folded(mb, op))


def _folded(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    """``op``'s fold, with the operators a fold emits folded in turn (a matmul whose batch
    runs alternate emits a BROADCAST_TO, itself maybe above its limit); None: within limits."""
    new = FOLDS[op.code](mb, op) if op.code in FOLDS else None
    if new is None:
        return None
    return [o for n in new for o in ((_folded(mb, n) or [n]) if n is not op else [n])]


def _fold_elementwise(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    if len(op.outputs) != 1:
        return None
    out_t = op.outputs[0]
    out = mb.dims(out_t)
    ins = [mb.dims(t) for t in op.inputs]
    limit = elementwise_max_rank(op_name(op.code), ins, out)
    if len(out) <= limit:
        return None
    rank = len(out)
    padded = [dims.padded(d, rank) for d in ins]
    hints = [dims.padded(mb.tensors[t].shape, rank) for t in op.inputs]
    # runs of positions where each operand is 1 or full alike; size-1 output positions drop out
    groups = dims.runs([tuple(p[k] == 1 for p in padded) for k in range(rank)], skip=lambda k: out[k] == 1)
    if len(groups) > limit:
        return _refuse(op, out, ins, limit)
    new_ops: list[OperatorInfo] = []
    new_ins = []
    for t, d, p, h in zip(op.inputs, ins, padded, hints):
        if not d:  # a scalar broadcasts at any rank
            new_ins.append(t)
            continue
        sig = dims.fold(p, groups)
        if sig.count(-1) > 1:
            return _refuse(op, out, ins, limit)
        view, reshape = mb.reshaped(t, sig, dims.fold(h, groups), f"{mb.tensors[t].name}/folded", op.source)
        new_ops += reshape
        new_ins.append(view)
    sig, shape = dims.fold(out, groups), dims.fold(mb.tensors[out_t].shape, groups)
    if sig.count(-1) > 1 or out.count(-1) > 1:
        return _refuse(op, out, ins, limit)
    mid = mb.like(out_t, sig, shape)
    new_ops.append(OperatorInfo(op.code, new_ins, [mid], op.options, op.source))
    new_ops.append(mb.reshape_into(mid, out_t, op.source))
    return new_ops


def _fold_rms_norm(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    """RMS_NORM normalizes each row of the last dim; onert's kernel takes ranks
    ``limits.RMS_NORM`` only, so any other rank runs as ``[1, rows, D]`` (row-major: exact)."""
    x, out_t = op.inputs[0], op.outputs[0]
    shape = mb.dims(x)
    if not shape or len(shape) in limits.RMS_NORM:
        return None
    as3d = [1, dims.numel(shape[:-1]), shape[-1]]
    if as3d.count(-1) > 1:
        return None  # the check after this step names it
    hint = [1, dims.numel(mb.tensors[x].shape[:-1]), mb.tensors[x].shape[-1]]
    x3, new_ops = mb.reshaped(x, as3d, hint, f"{mb.tensors[x].name}/3d", op.source)
    y3 = mb.like(out_t, as3d, hint, f"{mb.tensors[out_t].name}/3d")
    new_ops.append(OperatorInfo(op.code, [x3, *op.inputs[1:]], [y3], op.options, op.source))
    new_ops.append(mb.reshape_into(y3, out_t, op.source))
    return new_ops


def _split_depthwise(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    """A DEPTHWISE_CONV_2D deeper than ``limits.DEPTHWISE_DEPTH`` as slices of whole input
    channels (each with its ``multiplier`` output channels) within the limit."""
    x, w, b = op.inputs[:3]
    out_t = op.outputs[0]
    out, x_dims = mb.dims(out_t), mb.dims(x)
    depth = out[-1]
    if depth <= limits.DEPTHWISE_DEPTH or x_dims[-1] <= 0 or depth % x_dims[-1]:
        return None
    mult = depth // x_dims[-1]
    winfo = mb.tensors[w]
    if not winfo.buffer or (b >= 0 and not mb.tensors[b].buffer):
        return None  # a run-time filter: the check after this step names the operator
    per = max(limits.DEPTHWISE_DEPTH // mult, 1)  # input channels per slice
    n = -(-x_dims[-1] // per)
    per = -(-x_dims[-1] // n)  # balanced slices
    filt = mb.values(w)
    bias = mb.values(b).reshape(-1) if b >= 0 else None
    xinfo, oinfo = mb.tensors[x], mb.tensors[out_t]
    new_ops, pieces = [], []
    for k, c0 in enumerate(range(0, x_dims[-1], per)):
        c1 = min(c0 + per, x_dims[-1])
        rank = len(x_dims)
        begin, end = [0] * (rank - 1) + [c0], [0] * (rank - 1) + [c1]
        mask = (1 << (rank - 1)) - 1  # whole extent of every dim but channels (dynamic ones too)
        consts = [mb.add_constant(f"{xinfo.name}/depth{k}_{name}", np.asarray(v, np.int32))
                  for name, v in (("begin", begin), ("end", end), ("strides", [1] * rank))]
        xs = mb.add_tensor(f"{xinfo.name}/depth{k}", list(xinfo.shape[:-1]) + [c1 - c0], xinfo.type, 0,
                           x_dims[:-1] + [c1 - c0] if -1 in x_dims else None, xinfo.quantization)
        new_ops.append(OperatorInfo(BO.STRIDED_SLICE, [x, *consts], [xs],
                                    options("StridedSliceOptions", beginMask=mask, endMask=mask), op.source))
        cols = slice(c0 * mult, c1 * mult)
        wk = mb.add_constant(f"{winfo.name}/depth{k}", np.ascontiguousarray(filt[..., cols]),
                             quantization=_columns(winfo.quantization, cols))
        ins = [xs, wk]
        if b >= 0:
            ins.append(mb.add_constant(f"{mb.tensors[b].name}/depth{k}", np.ascontiguousarray(bias[cols]),
                                       quantization=_columns(mb.tensors[b].quantization, cols)))
        ins += op.inputs[3:]
        ys = mb.add_tensor(f"{oinfo.name}/depth{k}", list(oinfo.shape[:-1]) + [(c1 - c0) * mult], oinfo.type, 0,
                           out[:-1] + [(c1 - c0) * mult] if -1 in out else None, oinfo.quantization)
        new_ops.append(OperatorInfo(op.code, ins, [ys], op.options, op.source))
        pieces.append(ys)
    new_ops.append(OperatorInfo(BO.CONCATENATION, pieces, [out_t],
                                options("ConcatenationOptions", axis=len(out) - 1), op.source))
    return new_ops


def _fold_broadcast_to(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    """BROADCAST_TO above rank ``limits.BROADCAST_TO`` (6: wrong values, 7: crash) needs one dim
    per run of neighbouring positions all repeated or all kept (target size-1 positions drop
    out), rarely more than three: RESHAPE in, the broadcast on the runs, RESHAPE out."""
    x, out_t = op.inputs[0], op.outputs[0]
    dst = mb.dims(out_t)
    if len(dst) <= limits.BROADCAST_TO:
        return None
    src = dims.padded(mb.dims(x), len(dst))
    if -1 in src or -1 in dst:
        return None  # BROADCAST_TO takes a constant shape: the check after this step names it
    groups = dims.runs([own == want for own, want in zip(src, dst)], skip=lambda k: dst[k] == 1)
    if len(groups) > limits.BROADCAST_TO:
        raise op.unsupported(
            f"broadcasting {src} to {dst}{op.where} needs a rank-{len(groups)} BROADCAST_TO; onert 0.1.0's is "
            f"correct up to rank {limits.BROADCAST_TO} only")
    own, want = dims.fold(src, groups), dims.fold(dst, groups)
    xv, new_ops = mb.reshaped(x, own, own, f"{mb.tensors[x].name}/folded", op.source)
    mid = mb.like(out_t, want)
    new_ops.append(OperatorInfo(op.code, [xv, _shape_const(mb, mb.tensors[mid].name, want)], [mid], op.options,
                                op.source))
    new_ops.append(mb.reshape_into(mid, out_t, op.source))
    return new_ops


def _fold_pad(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    """PAD / PADV2 above rank ``limits.PAD`` ("Padding for rank > 4 NYI"): each run of
    neighbouring unpadded dims merges into one (row-major: the padded dims keep their place),
    RESHAPE in, the PAD on the folded dims, RESHAPE out. More padded dims than the limit: refused."""
    x, out_t = op.inputs[0], op.outputs[0]
    src = mb.dims(x)
    if len(src) <= limits.PAD:
        return None
    table = mb.values(op.inputs[1]).reshape(len(src), 2).tolist()
    keys = [("pad", k) if any(table[k]) else "keep" for k in range(len(src))]
    groups = dims.runs(keys, skip=lambda k: src[k] == 1 and not any(table[k]))
    own = dims.fold(src, groups)
    if len(groups) > limits.PAD or own.count(-1) > 1:
        raise op.unsupported(f"a {len(src)}-D {op_name(op.code)} padding {table}{op.where}: onert 0.1.0 pads "
                             f"rank <= {limits.PAD} only, and these dims do not merge into {limits.PAD}")
    hint = dims.fold(mb.tensors[x].shape, groups)
    xv, new_ops = mb.reshaped(x, own, hint, f"{mb.tensors[x].name}/folded", op.source)
    pads = np.asarray([table[ks[0]] if key != "keep" else [0, 0] for key, ks in groups], np.int32)
    mid = mb.like(out_t, dims.fold(mb.dims(out_t), groups), dims.fold(mb.tensors[out_t].shape, groups))
    pad_t = mb.add_constant(f"{mb.tensors[mid].name}/paddings", pads)
    new_ops.append(OperatorInfo(op.code, [xv, pad_t, *op.inputs[2:]], [mid], op.options, op.source))
    new_ops.append(mb.reshape_into(mid, out_t, op.source))
    return new_ops


SAME, ONE_IN_A, ONE_IN_B = "same", "a1", "b1"


def _fold_batch_matmul(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    """BATCH_MATMUL with an operand above rank ``limits.BATCH_MATMUL`` (onert 0.1.0 refuses
    rank 5 at prepare). Within rank 4 onert broadcasts freely (either operand's batch dims may
    be 1 against the other's, both ways at once, ranks may differ: docs/onert-findings.md §3),
    so batch positions (right-aligned; a missing one counts as 1) are classed by how they
    broadcast: same size in both, 1 in ``a`` only, 1 in ``b`` only. Positions 1 in both drop;
    consecutive positions of one class multiply into one dim (row-major: every RESHAPE is
    exact). Two runs fit in rank 4; more (1s alternating between the operands, rare) are
    broadcast to the full batch first (:func:`_expand_batch`), which makes it one run."""
    a, b = op.inputs[:2]
    out_t = op.outputs[0]
    ad, bd = mb.dims(a), mb.dims(b)
    if min(len(ad), len(bd)) < 2 or max(len(ad), len(bd)) <= limits.BATCH_MATMUL:
        return None  # a 1-D operand is not Circle: the check after this step names it
    ah, bh = list(mb.tensors[a].shape), list(mb.tensors[b].shape)
    n = max(len(ad), len(bd)) - 2
    pa, pha, pb, phb = (dims.padded(d[:-2], n) for d in (ad, ah, bd, bh))
    # a static 1 against anything else broadcasts; otherwise the sizes are equal; 1 in both: dropped
    kinds = [ONE_IN_A if x == 1 else ONE_IN_B if y == 1 else SAME for x, y in zip(pa, pb)]
    groups = dims.runs(kinds, skip=lambda k: pa[k] == 1 and pb[k] == 1)
    new_ops: list[OperatorInfo] = []
    if len(groups) > limits.BATCH_MATMUL - 2:
        a, b, pa, pha, pb, phb, groups = _expand_batch(mb, op, groups, pa, pb, ad[-2:], bd[-2:], new_ops)
    ga, gha, gb, ghb = (dims.fold(d, groups) if groups else [] for d in (pa, pha, pb, phb))
    a = _mm_operand(mb, a, ga + ad[-2:], gha + ah[-2:], "lhs", op.source, new_ops)
    b = _mm_operand(mb, b, gb + bd[-2:], ghb + bh[-2:], "rhs", op.source, new_ops)
    batch = [y if kind == ONE_IN_A else x if kind == ONE_IN_B or x != -1 else y
             for (kind, _), x, y in zip(groups, ga, gb)]
    sig = batch + [ad[-2], bd[-1]]
    hint = [max(x, y) for x, y in zip(gha, ghb)] + [ah[-2], bh[-1]]
    if sig == mb.dims(out_t):
        return new_ops + [OperatorInfo(op.code, [a, b], [out_t], op.options, op.source)]
    mm = mb.like(out_t, sig, hint)
    new_ops.append(OperatorInfo(op.code, [a, b], [mm], op.options, op.source))
    new_ops.append(mb.reshape_into(mm, out_t, op.source))
    return new_ops


def _mm_operand(mb, t, sig, hint, side, source, new_ops) -> int:
    """Operand ``t`` as ``sig`` with leading 1s dropped (BATCH_MATMUL broadcasts ranks)."""
    while len(sig) > 2 and sig[0] == 1:
        sig, hint = sig[1:], hint[1:]
    view, ops = mb.reshaped(t, sig, hint, f"{mb.tensors[t].name}/mm_{side}", source)
    new_ops += ops
    return view


def _expand_batch(mb, op, groups, pa, pb, a_mat, b_mat, new_ops):
    """More broadcast runs than rank 4 holds: each operand BROADCAST_TO the full batch (folded
    in turn by :func:`_fold_broadcast_to`), after which the batch is one 'same' run."""
    a, b = op.inputs[:2]
    if -1 in pa + pb + a_mat + b_mat:
        raise op.unsupported(
            f"a {op_name(op.code)}{op.where} whose batch dims broadcast in more than two alternating runs needs "
            f"static shapes (BROADCAST_TO takes a constant shape)")
    full = [max(x, y) for x, y in zip(pa, pb)]
    outs = []
    for t, own, mat in ((a, pa, a_mat), (b, pb, b_mat)):
        if own == full:
            outs.append(t)  # nothing to broadcast: the fold RESHAPEs it
            continue
        info = mb.tensors[t]
        src, ops = mb.reshaped(t, own + mat, own + mat, f"{info.name}/mm_batch", op.source)
        wide = mb.like(t, full + mat, name=f"{info.name}/mm_expanded")
        ops.append(OperatorInfo(BO.BROADCAST_TO, [src, _shape_const(mb, f"{info.name}/mm_expanded", full + mat)],
                                [wide], None, op.source))
        new_ops += ops
        outs.append(wide)
    one = [(SAME, list(range(len(full))))]
    return outs[0], outs[1], full, full, full, full, one


def _columns(q: QuantParams | None, cols: slice) -> QuantParams | None:
    """The quantization of channel columns ``cols`` (per-channel scales sliced with them)."""
    if q is None or len(q.scale) == 1:
        return q
    return QuantParams(q.scale[cols], q.zero_point[cols], q.axis)


#: the folds the Circle op table (``circle/op_table.py``, ``fold=``) names, by name
STRATEGIES = {"elementwise": _fold_elementwise, "rms_norm": _fold_rms_norm, "depthwise_split": _split_depthwise,
              "broadcast_to": _fold_broadcast_to, "batch_matmul": _fold_batch_matmul, "pad": _fold_pad,
              "strided_slice": axes.fold_strided_slice, "reduce": axes.fold_reduce}
#: Circle op -> its fold (replacement operators, or None when it is within its limit)
FOLDS = {code: STRATEGIES[r.fold] for code, r in op_table.BY_CODE.items() if r.fold is not None}


def _refuse(op: OperatorInfo, out: list[int], ins: list[list[int]], limit: int):
    """An operator onert would compute wrongly (or crash on) that no RESHAPE brings within its
    limit: an export-time error naming it and its source line, never a silently wrong file."""
    name = op_name(op.code)
    raise op.unsupported(
        f"a {len(out)}-D {name} of operands {ins}{op.where}: onert 0.1.0 computes {name} correctly up to "
        f"rank {limit} only, and these dims do not merge into {limit} (dynamic or alternating broadcasts)")


def _shape_const(mb: ModelBuilder, name: str, target: list[int]) -> int:
    return mb.add_constant(f"{name}/fold_shape", np.asarray(target, np.int32))
