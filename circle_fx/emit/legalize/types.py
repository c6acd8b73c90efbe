"""Data-movement operators on element types onert 0.1.0 does not run, routed through an exact
carrier type after lowering.

onert 0.1.0 has no bool kernel for STRIDED_SLICE, SPLIT, CONCATENATION, BROADCAST_TO, GATHER...
and no int64 kernel for TRANSPOSE, GATHER, BROADCAST_TO (the Circle op table's ``types``, ``circle/op_table.py``, measured).
The file loads and fails at run time. Any lowering can emit such an op on any type (a bool
mask sliced, split, expanded above rank 5, selected with a dynamic batch...), so the fix is one
step over the emitted operators (the ``types`` step of ``emit/legalize``), instead of a special case per lowering:

- SLICE (float32 only) of another type: the same STRIDED_SLICE, which runs int32 and int64.
- PAD / PADV2 of integers: CONCATENATION with constant blocks of the pad value.
- SELECT_V2 of integer or bool values (float only): arithmetic / logic, exact for every value.
- TILE of integers or bools (float only): ADD / LOGICAL_OR of a zeros constant of the multiples.
- SQUARE of integers (float only): MUL of the input by itself.
- TRANSPOSE of another type that moves only size-1 dims: the RESHAPE it is (any type).
- bool: CAST to int32 (float32 where the op runs no int32) in, the op, CAST back. Exact: 0 and
  1 survive both casts, and data movement never makes a new value. Constants are converted
  in place.
- integers stored in constants whose values fit a type the op runs exactly (int64 ids below
  2**31 -> int32): the constant is stored in that type and the output CAST back.
- int64 (int32, int8) values known only at run time on an op without their kernel: no carrier
  is exact for every value (int64 -> int32 wraps above 2**31, -> float32 rounds above 2**24), so
  an UnsupportedOpError names the op and the model line instead of writing a file that fails
  at run time. BROADCAST_TO of int64 is the exception: ADD of a zeros constant broadcasts it
  exactly (onert's int64 ADD broadcasts).
"""
from __future__ import annotations

import numpy as np

from ...circle.dims import broadcast, padded
from ...circle.op_table import ELEMENT_TYPES, data_inputs, unsupported_type
from ...circle.schema import CIRCLE_TO_NUMPY, TT, make_options as options, type_name
from ..builder import BO, ModelBuilder, OperatorInfo, op_name

#: carriers tried for a bool tensor, in order (CAST bool <-> int32 / float32 are exact in onert)
_BOOL_CARRIERS = ("INT32", "FLOAT32")
#: largest integer magnitude a carrier holds exactly
_EXACT = {"INT32": 2**31 - 1, "FLOAT32": 2**24}


def legalize(mb: ModelBuilder) -> int:
    """Retype every data-movement operator whose element type onert does not run, in place;
    return how many."""
    return mb.rewrite_operators(lambda op: _retype(mb, op) if op_name(op.code) in ELEMENT_TYPES else None)


def _tname(mb: ModelBuilder, t: int) -> str:
    return type_name(mb.tensors[t].type)


def _retype(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    name = op_name(op.code)
    data = [op.inputs[p] for p in data_inputs(name, len(op.inputs)) if op.inputs[p] >= 0]
    if any(mb.tensors[t].quantization is not None for t in data + op.outputs):
        return None  # quantized tensors: the quantized-weights lowerings own those paths
    bad = unsupported_type(name, [_tname(mb, t) for t in data])
    if bad is None:
        return None
    if name == "SELECT_V2":
        return _select_by_arithmetic(mb, op)
    if name == "SQUARE":  # integers: MUL x x, exact (onert's int32 / int64 MUL)
        return [OperatorInfo(BO.MUL, [op.inputs[0], op.inputs[0]], list(op.outputs), options("MulOptions"),
                             op.source)]
    if name == "TILE" and mb.tensors[op.inputs[1]].buffer:
        return _tile_by_broadcast(mb, op)
    if name == "TRANSPOSE" and (view := _transpose_as_reshape(mb, op)) is not None:
        return [view]
    if name == "SLICE" and all(mb.tensors[t].buffer for t in op.inputs[1:]):
        strided = _as_strided_slice(mb, op)  # STRIDED_SLICE runs int32/int64; bool still needs a carrier
        return [strided] if (more := _retype(mb, strided)) is None else more
    wrong = [t for t in data if _tname(mb, t) == bad]
    carrier = _carrier(mb, bad, ELEMENT_TYPES[name][1], wrong)
    if carrier is None:
        if name == "BROADCAST_TO" and bad == "INT64":
            return _broadcast_by_add(mb, op)
        if name in ("PAD", "PADV2") and (concat := _pad_by_concat(mb, op)) is not None:
            return concat
        _refuse(op, name, bad, ELEMENT_TYPES[name][1], all(mb.tensors[t].buffer for t in wrong))
    code = getattr(TT, carrier)
    new_ops: list[OperatorInfo] = []
    inputs = [_converted(mb, t, carrier, new_ops, op.source) if t in wrong else t for t in op.inputs]
    outputs, tail = [], []
    for o in op.outputs:
        info = mb.tensors[o]
        if _tname(mb, o) != bad:
            outputs.append(o)
            continue
        mid = mb.add_tensor(f"{info.name}/{carrier.lower()}", list(info.shape), code, 0, info.shape_signature)
        tail.append(OperatorInfo(BO.CAST, [mid], [o], None, op.source))
        outputs.append(mid)
    return new_ops + [OperatorInfo(op.code, inputs, outputs, op.options, op.source)] + tail


def _carrier(mb: ModelBuilder, bad: str, runs: frozenset, wrong: list[int]) -> str | None:
    """A type the op runs that holds every value of the ``wrong`` tensors exactly, or None."""
    if bad == "BOOL":
        return next((c for c in _BOOL_CARRIERS if c in runs), None)
    if bad not in ("INT64", "INT32") or not all(mb.tensors[t].buffer for t in wrong):
        return None  # run-time integers: no carrier is exact for every value (int8: onert has no int8 CAST)
    biggest = max((int(np.abs(mb.values(t).astype(np.int64)).max(initial=0)) for t in wrong), default=0)
    return next((c for c in ("INT32", "FLOAT32") if c in runs and biggest <= _EXACT[c]), None)


def _converted(mb: ModelBuilder, t: int, carrier: str, ops: list, source: str) -> int:
    """``t`` in the carrier type: a converted constant, else a CAST."""
    info = mb.tensors[t]
    code = getattr(TT, carrier)
    if info.buffer:
        data = mb.values(t).astype(CIRCLE_TO_NUMPY[code])
        return mb.add_constant(f"{info.name}/{carrier.lower()}", data)
    out = mb.add_tensor(f"{info.name}/{carrier.lower()}", list(info.shape), code, 0, info.shape_signature)
    ops.append(OperatorInfo(BO.CAST, [t], [out], None, source))
    return out


def _transpose_as_reshape(mb: ModelBuilder, op: OperatorInfo) -> OperatorInfo | None:
    """A TRANSPOSE that moves only size-1 dims, as the RESHAPE it is (same element order, any
    type: XLNet's ``input_ids.transpose(0, 1)`` on batch 1); None when it moves data (or has
    more than one dynamic dim)."""
    dims = mb.dims(op.inputs[0])
    if not mb.tensors[op.inputs[1]].buffer or dims.count(-1) > 1:
        return None
    perm = [int(p) % max(1, len(dims)) for p in mb.values(op.inputs[1]).ravel()]
    if [p for p in perm if dims[p] != 1] != [d for d in range(len(dims)) if dims[d] != 1]:
        return None
    return mb.reshape_into(op.inputs[0], op.outputs[0], op.source)


def _as_strided_slice(mb: ModelBuilder, op: OperatorInfo) -> OperatorInfo:
    """SLICE (begin, size; size -1 = to the end) as the same STRIDED_SLICE (end = begin + size,
    an end-mask bit where size is -1, strides 1): onert 0.1.0's SLICE runs float32 only."""
    begin = [int(v) for v in mb.values(op.inputs[1]).reshape(-1)]
    size = [int(v) for v in mb.values(op.inputs[2]).reshape(-1)]
    end = [0 if s == -1 else b + s for b, s in zip(begin, size)]
    mask = sum(1 << d for d, s in enumerate(size) if s == -1)
    consts = [mb.add_constant(f"{mb.tensors[op.outputs[0]].name}/{n}", np.asarray(v, np.int32))
              for n, v in (("begin", begin), ("end", end), ("strides", [1] * len(begin)))]
    return OperatorInfo(BO.STRIDED_SLICE, [op.inputs[0], *consts], list(op.outputs),
                        options("StridedSliceOptions", endMask=mask), op.source)


def _pad_by_concat(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    """PAD / PADV2 of integers (onert pads float32 and int8 only) as CONCATENATIONs with
    constant blocks of the pad value, one per padded dim (CONCATENATION runs int32/int64). The
    blocks need every other dim static; None otherwise."""
    x, out = op.inputs[0], op.outputs[0]
    info = mb.tensors[x]
    sig = mb.dims(x)
    table = mb.values(op.inputs[1]).reshape(-1, 2)
    value = mb.values(op.inputs[2]).reshape(-1)[0] if len(op.inputs) > 2 and op.inputs[2] >= 0 else 0
    padded = [d for d in range(len(sig)) if table[d].any()]
    if not all(-1 not in sig[:d] + sig[d + 1:] for d in padded):
        return None
    dtype = CIRCLE_TO_NUMPY[info.type]
    ops, cur, shape = [], x, list(info.shape)
    for k, d in enumerate(padded):
        parts = []
        for amount in table[d]:
            block = list(shape)
            block[d] = int(amount)
            parts.append(mb.add_constant(f"{mb.tensors[out].name}/pad", np.full(block, value, dtype)) if amount else None)
        shape[d] += int(table[d].sum())
        nxt = out if k == len(padded) - 1 else mb.add_tensor(f"{mb.tensors[out].name}/padded", list(shape), info.type)
        ins = [t for t in (parts[0], cur, parts[1]) if t is not None]
        ops.append(OperatorInfo(BO.CONCATENATION, ins, [nxt], options("ConcatenationOptions", axis=d), op.source))
        cur = nxt
    return ops


def _broadcast_by_add(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo]:
    """int64 BROADCAST_TO as ADD of an int64 zeros constant of the repeated sizes (exact)."""
    x, out = op.inputs[0], op.outputs[0]
    src, dst = list(mb.tensors[x].shape), list(mb.tensors[out].shape)
    sig = mb.tensors[out].shape_signature
    if sig is not None and -1 in list(sig):
        _refuse(op, "BROADCAST_TO", "INT64", ELEMENT_TYPES["BROADCAST_TO"][1])
    src = padded(src, len(dst))
    zeros = mb.add_constant(f"{mb.tensors[out].name}/broadcast", np.zeros([d if s == 1 else 1 for s, d in zip(src, dst)],
                                                                           np.int64))
    return [OperatorInfo(BO.ADD, [x, zeros], [out], options("AddOptions"), op.source)]


def _tile_by_broadcast(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo]:
    """TILE of integers or bools (onert 0.1.0's TILE is float only: "Tile: unsupported data
    type" for int32/int64/bool) as a broadcast against a zeros (False) constant of the
    multiples: ADD for integers, LOGICAL_OR for bool. Exact for every value, no carrier, and
    it keeps the dynamic dims a TILE of a dynamic ``expand`` has (multiple 1 on each)."""
    x, out = op.inputs[0], op.outputs[0]
    multiples = [int(m) for m in mb.values(op.inputs[1]).ravel()]
    info = mb.tensors[out]
    zeros = mb.add_constant(f"{info.name}/broadcast", np.zeros(multiples, CIRCLE_TO_NUMPY[info.type]))
    code, opts = (BO.LOGICAL_OR, None) if info.type == TT.BOOL else (BO.ADD, options("AddOptions"))
    return [OperatorInfo(code, [x, zeros], [out], opts, op.source)]


def _select_by_arithmetic(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo]:
    """SELECT_V2 of integer or bool values (onert 0.1.0 selects float only: "Select: unsupported
    data type" at run time) without a carrier: integers as ``a * CAST(c) + b * CAST(!c)`` (exact:
    a product by 0 or 1, also int64 beyond 2**31, which no carrier holds), bools as
    ``(c & a) | (!c & b)``."""
    c, a, b = op.inputs
    out = op.outputs[0]
    vtype, src = mb.tensors[out].type, op.source
    cinfo = mb.tensors[c]

    def tensor(name, dims, hint, ttype):
        return mb.add_tensor(f"{cinfo.name}/{name}", hint, ttype, 0, dims if -1 in dims else None)

    cdims, chint = mb.dims(c), list(cinfo.shape)
    not_c = tensor("not_cond", cdims, chint, TT.BOOL)
    ops = [OperatorInfo(BO.LOGICAL_NOT, [c], [not_c], None, src)]
    if vtype == TT.BOOL:
        code, opts, c_of, not_c_of = BO.LOGICAL_AND, None, c, not_c
    else:
        code, opts = BO.MUL, options("MulOptions")
        c_of, not_c_of = tensor("cond_int", cdims, chint, vtype), tensor("not_cond_int", cdims, chint, vtype)
        ops += [OperatorInfo(BO.CAST, [c], [c_of], None, src), OperatorInfo(BO.CAST, [not_c], [not_c_of], None, src)]
    picked = []
    for t, mask in ((a, c_of), (b, not_c_of)):
        part = tensor("picked", broadcast(cdims, mb.dims(t)), broadcast(chint, list(mb.tensors[t].shape)), vtype)
        ops.append(OperatorInfo(code, [t, mask], [part], opts, src))
        picked.append(part)
    ops.append(OperatorInfo(BO.LOGICAL_OR if vtype == TT.BOOL else BO.ADD, picked, [out],
                            None if vtype == TT.BOOL else options("AddOptions"), src))
    return ops


def _refuse(op: OperatorInfo, name: str, bad: str, runs: frozenset, constant: bool = False) -> None:
    what = "constants (beyond what it runs exactly)" if constant else "values known only at run time"
    raise op.unsupported(
        f"a {name} of {bad.lower()} {what}{op.where}: onert 0.1.0 runs {name} on "
        f"{', '.join(sorted(t.lower() for t in runs))} only, and no type it runs holds every {bad.lower()} "
        f"value exactly; cast the tensor to a type it runs in the model")
