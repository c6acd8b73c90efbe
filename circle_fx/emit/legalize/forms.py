"""Operator forms onert 0.1.0 refuses or miscomputes, rewritten into forms it runs (one step each).

Each rewrite is the step of the Circle op table's form limit of the same name
(``circle/op_table.py``, ``forms=``; the check is in ``circle/limits.py``, which ``verify``
reports a file with): the lowerings emit plain Circle, whatever onert makes of it.

- ``constant_lhs``: BATCH_MATMUL refuses a constant lhs at load ("OperationValidator
  failed at line 123"; a constant rhs is fine), so ``A @ B`` runs as ``(B^T @ A^T)^T`` with
  ``A^T`` transposed now (Mamba's ``dt_proj.weight @ x``, ``W @ v``). A swap of two dims one of
  which is a static 1 is a RESHAPE (row-major order unchanged), so a matrix-vector product keeps
  no TRANSPOSE (the peephole merges the RESHAPEs), and the peephole turns the one in front of
  the BATCH_MATMUL into ``adjointLhs``.
- ``dynamic_rms_norm``: onert's RMS_NORM fails on dynamic shapes (or keeps the old shape
  when resized), so one with a dynamic input runs decomposed:
  ``x * rsqrt(mean(x*x, -1) + eps) * gamma`` as MUL/MEAN/ADD/RSQRT/MUL/MUL, which onert resizes.
- ``ggml_rows``: a FULLY_CONNECTED flattens an N-D input into rows itself, but with a GGML block
  weight onert's ggml kernel aborts the process unless the input is 2-D or ``[1, rows, in]``
  (measured), so an N-D input is RESHAPEd to ``[rows, in]`` first (the FC writes ``[rows, out]``
  either way); the peephole drops that RESHAPE where the limit allows (it asks the same limit:
  ``limits.fully_connected_input_problem``).
- ``ggml_bias``: onert's ggml FULLY_CONNECTED kernel throws on a bias and ignores a fused
  activation (measured: benchmarks/onert_fc_activation.py): both move into an ADD after the FC
  (of zeros when there is no bias), exact.
- ``ggml_gather_ids``: onert's GATHER from a GGML block table takes 1-D int32 indices only (int64
  fails; ids ``[B, T]`` with B > 1 fill only the first row): the ids are CAST to int32 and
  flattened, the GATHER writes ``[ids, D]`` rows, a RESHAPE gives them the ids' shape.
- ``rope_positions``: onert's ROPE applies the tables' first row to every
  position, so one whose tables hold several runs as ``x*cos + rotate_half(x)*sin``
  (``rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2])``, GPT-NeoX, what ROPE's mode computes).
"""
from __future__ import annotations

import copy

import numpy as np

from ...circle.dims import broadcast
from ...circle.limits import holds_several_positions
from ...circle.schema import CIRCLE_TO_NUMPY, TT, make_options as options, type_name
from ..builder import BO, ModelBuilder, OperatorInfo


def constant_lhs(mb: ModelBuilder) -> int:
    return mb.rewrite_operators(lambda op: _swap_operands(mb, op) if op.code == BO.BATCH_MATMUL else None)


def dynamic_rms_norm(mb: ModelBuilder) -> int:
    return mb.rewrite_operators(lambda op: _decomposed_rms_norm(mb, op) if op.code == BO.RMS_NORM else None)


def ggml_rows(mb: ModelBuilder) -> int:
    return mb.rewrite_operators(lambda op: _rows(mb, op) if op.code == BO.FULLY_CONNECTED else None)


def ggml_bias(mb: ModelBuilder) -> int:
    return mb.rewrite_operators(lambda op: _bias_as_add(mb, op) if op.code == BO.FULLY_CONNECTED else None)


def ggml_gather_ids(mb: ModelBuilder) -> int:
    return mb.rewrite_operators(lambda op: _ggml_ids(mb, op) if op.code == BO.GATHER else None)


def rope_positions(mb: ModelBuilder) -> int:
    return mb.rewrite_operators(lambda op: _decomposed_rope(mb, op) if op.code == BO.ROPE else None)


# ---------------------------------------------------------------- constant matmul lhs
def _swap_operands(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    a, b = op.inputs[:2]
    ainfo, out = mb.tensors[a], op.outputs[0]
    if not ainfo.buffer or mb.tensors[b].buffer or CIRCLE_TO_NUMPY.get(ainfo.type) != np.float32:
        return None
    if op.options is not None and (op.options.adjointLhs or op.options.adjointRhs):
        return None  # the lowerings emit plain products; nothing else to swap yet
    at = mb.add_constant(f"{ainfo.name}/lhs_T", np.ascontiguousarray(mb.values(a).swapaxes(-1, -2)))
    ops: list[OperatorInfo] = []
    bt = _swapped_last(mb, b, None, ops, op.source, "rhs_T")
    od = mb.dims(out)
    prod = mb.like(out, _swapped(od), _swapped(list(mb.tensors[out].shape)), f"{mb.tensors[out].name}/mm_T")
    ops.append(OperatorInfo(BO.BATCH_MATMUL, [bt, at], [prod], options("BatchMatMulOptions"), op.source))
    _swapped_last(mb, prod, out, ops, op.source, "mm")
    return ops


def _swapped(dims: list[int]) -> list[int]:
    return dims[:-2] + dims[-1:] + dims[-2:-1]


def _swapped_last(mb: ModelBuilder, src: int, out: int | None, ops: list, source: str, name: str) -> int:
    """``src`` with its last two dims swapped (into ``out`` when given): a RESHAPE when one of
    them is a static 1, else a TRANSPOSE."""
    dims, info = mb.dims(src), mb.tensors[src]
    if out is None:
        out = mb.like(src, _swapped(dims), _swapped(list(info.shape)), f"{info.name}/{name}")
    if 1 in dims[-2:]:
        ops.append(mb.reshape_into(src, out, source))
    else:
        perm = mb.add_constant(f"{info.name}/{name}_perm", np.asarray(_swapped(list(range(len(dims)))), np.int32))
        ops.append(OperatorInfo(BO.TRANSPOSE, [src, perm], [out], options("TransposeOptions"), source))
    return out


# ------------------------------------------------------------------- dynamic RMS_NORM
def _decomposed_rms_norm(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    x, gamma = op.inputs[:2]
    out = op.outputs[0]
    dims = mb.dims(x)
    if -1 not in dims:
        return None
    info, src = mb.tensors[x], op.source
    hint = list(info.shape)
    col, col_hint = dims[:-1] + [1], hint[:-1] + [1]  # one value per row
    name = mb.tensors[out].name
    sq, ms = mb.like(x, dims, hint, f"{name}/square"), mb.like(x, col, col_hint, f"{name}/mean_square")
    var, inv = mb.like(x, col, col_hint, f"{name}/plus_eps"), mb.like(x, col, col_hint, f"{name}/rsqrt")
    normed = mb.like(x, dims, hint, f"{name}/normed")
    axes = mb.add_constant(f"{name}/axes", np.asarray([len(dims) - 1], np.int32))
    eps = mb.add_constant(f"{name}/eps", np.array(op.options.epsilon, dtype=CIRCLE_TO_NUMPY[info.type]))
    mul = lambda: options("MulOptions")  # noqa: E731  (one options object per operator)
    return [OperatorInfo(BO.MUL, [x, x], [sq], mul(), src),
            OperatorInfo(BO.MEAN, [sq, axes], [ms], options("ReducerOptions", keepDims=True), src),
            OperatorInfo(BO.ADD, [ms, eps], [var], options("AddOptions"), src),
            OperatorInfo(BO.RSQRT, [var], [inv], None, src),
            OperatorInfo(BO.MUL, [x, inv], [normed], mul(), src),
            OperatorInfo(BO.MUL, [normed, gamma], [out], mul(), src)]


# ------------------------------------------------------------ ROPE tables of one position
def _decomposed_rope(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    x, sin, cos = op.inputs
    out = op.outputs[0]
    if not any(holds_several_positions(mb.dims(t)) for t in (sin, cos)):
        return None
    dims, info, src = mb.dims(x), mb.tensors[x], op.source
    d = dims[-1]
    if d < 0 or d % 2:
        return None  # verify's ROPE rule names it
    hint, half = list(info.shape), d // 2
    name = mb.tensors[out].name
    rank = len(dims)
    mask = (1 << (rank - 1)) - 1  # whole extent of every dim but the last
    ops, parts = [], []
    for k, (lo, hi) in enumerate(((half, d), (0, half))):
        consts = [mb.add_constant(f"{name}/half{k}_{what}", np.asarray(v, np.int32))
                  for what, v in (("begin", [0] * (rank - 1) + [lo]), ("end", [0] * (rank - 1) + [hi]),
                                  ("strides", [1] * rank))]
        part = mb.like(x, dims[:-1] + [half], hint[:-1] + [half], f"{name}/half{k}")
        ops.append(OperatorInfo(BO.STRIDED_SLICE, [x, *consts], [part],
                                options("StridedSliceOptions", beginMask=mask, endMask=mask), src))
        parts.append(part)
    neg = mb.like(x, dims[:-1] + [half], hint[:-1] + [half], f"{name}/neg_half")
    rotated = mb.like(x, dims, hint, f"{name}/rotated")
    ops += [OperatorInfo(BO.NEG, [parts[0]], [neg], None, src),
            OperatorInfo(BO.CONCATENATION, [neg, parts[1]], [rotated], options("ConcatenationOptions", axis=rank - 1),
                         src)]
    terms = []
    for t, what in ((cos, "times_cos"), (sin, "times_sin")):
        src_t = x if what == "times_cos" else rotated
        full = broadcast(mb.dims(src_t), mb.dims(t))
        term = mb.like(x, full, broadcast(list(mb.tensors[src_t].shape), list(mb.tensors[t].shape)), f"{name}/{what}")
        ops.append(OperatorInfo(BO.MUL, [src_t, t], [term], options("MulOptions"), src))
        terms.append(term)
    ops.append(OperatorInfo(BO.ADD, terms, [out], options("AddOptions"), src))
    return ops


# ------------------------------------------------------------------------ ggml rows
def _rows(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    x, w = op.inputs[:2]
    dims = mb.dims(x)
    if not type_name(mb.tensors[w].type).startswith("GGML_") or len(dims) == 2:
        return None  # any other rank: flattened, and the peephole drops the RESHAPE where the limit allows
    lead = dims[:-1]
    rows = -1 if -1 in lead else int(np.prod(lead))
    hint = list(mb.tensors[x].shape)
    flat, ops = mb.reshaped(x, [rows, dims[-1]], [int(np.prod(hint[:-1])), hint[-1]],
                            f"{mb.tensors[x].name}/rows", op.source)
    return ops + [OperatorInfo(op.code, [flat, *op.inputs[1:]], list(op.outputs), op.options, op.source)]


# ------------------------------------------------------------------- ggml gather ids
def _ggml_ids(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    table, ids = op.inputs[:2]
    out = op.outputs[0]
    dims = mb.dims(ids)
    i32 = mb.tensors[ids].type == TT.INT32
    if not type_name(mb.tensors[table].type).startswith("GGML_") or (i32 and len(dims) == 1) or -1 in dims:
        return None  # (a dynamic id shape: the check after this step names it)
    ops, hint = [], list(mb.tensors[ids].shape)
    if not i32:
        narrow = mb.add_tensor(f"{mb.tensors[ids].name}/ids_i32", hint, TT.INT32)
        ops.append(OperatorInfo(BO.CAST, [ids], [narrow], None, op.source))
        ids = narrow
    if len(dims) == 1:
        return ops + [OperatorInfo(op.code, [table, ids, *op.inputs[2:]], [out], op.options, op.source)]
    n = int(np.prod(dims))
    flat, view = mb.reshaped(ids, [n], [n], f"{mb.tensors[ids].name}/ids_flat", op.source)
    rows = mb.like(out, [n, mb.dims(out)[-1]], None, f"{mb.tensors[out].name}/rows")
    return ops + view + [OperatorInfo(op.code, [table, flat, *op.inputs[2:]], [rows], op.options, op.source),
                         mb.reshape_into(rows, out, op.source)]


# ------------------------------------------------------------------------ ggml bias
def _bias_as_add(mb: ModelBuilder, op: OperatorInfo) -> list[OperatorInfo] | None:
    x, w = op.inputs[:2]
    bias = op.inputs[2] if len(op.inputs) > 2 else -1
    act = getattr(op.options, "fusedActivationFunction", 0) or 0
    if not type_name(mb.tensors[w].type).startswith("GGML_") or (bias < 0 and not act):
        return None
    out = op.outputs[0]
    if bias < 0:  # the kernel ignores a fused activation: an ADD of 0 takes it
        bias = mb.add_constant(f"{mb.tensors[out].name}/zero_bias",
                               np.zeros(mb.dims(w)[0], CIRCLE_TO_NUMPY[mb.tensors[out].type]))
    fc_opts = copy.copy(op.options)
    fc_opts.fusedActivationFunction = 0
    mid = mb.like(out, mb.dims(out), list(mb.tensors[out].shape), f"{mb.tensors[out].name}/unbiased")
    return [OperatorInfo(op.code, [x, w, -1], [mid], fc_opts, op.source),
            OperatorInfo(BO.ADD, [mid, bias], [out], options("AddOptions", fusedActivationFunction=act), op.source)]
