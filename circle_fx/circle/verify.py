"""``circle_fx.verify``: structural checks of an emitted Circle file, without running it.

onert reacts to a malformed model with a segfault, a wrong answer or an error from deep
inside its shape validator; none of those say which tensor or operator is wrong. This
reads the file back (``circle_fx.circle.reader``) and checks, in one pass each:

- indices: every tensor, buffer and opcode index in range (``-1`` only as an optional input);
- data flow: every operator input is a graph input, a constant, or the output of an earlier
  operator; no tensor is produced twice; every graph output is produced, and read by no
  operator (onert reuses its memory: ``limits.output_read_problem``);
- onert's limits, from the Circle op table (``circle/op_table.py``): element types, ranks and
  forms (a constant matmul lhs, a dynamic RMS_NORM, ROPE tables of several positions, a GGML
  weight's input rank, a GGML table's indices), each form named by the legalization step that
  fixes it;
- index inputs (a warning, not an error): a GATHER reading a graph input's values unclamped,
  with no ``index_range`` for that input in ``circle_fx.limits`` (``limits.unclamped_index_problem``,
  the ``index_clamps`` step);
- constants: buffer size == prod(shape) * itemsize (4-bit ``INT4`` / ``UINT4``: two elements per
  byte, ``circle/int4.py``; such a tensor must be a quantized constant: a weight);
- options: every op that has an options table carries one of the right type (onert
  segfaults otherwise);
- types: elementwise inputs of one type (bool out of comparisons, a bool SELECT_V2 condition),
  reductions keep their input's type;
- shapes: the output shape follows the op's rule for the ops circle_fx emits (broadcasting,
  FULLY_CONNECTED, BATCH_MATMUL, RESHAPE, TRANSPOSE, CONCATENATION, GATHER, RMS_NORM, SOFTMAX,
  reductions, STRIDED_SLICE, PAD, ARG_MAX, CONV_2D, DEPTHWISE_CONV_2D, the 2-D pools, SPLIT). Dynamic dims (``-1`` in ``shape_signature``) match anything;
- signatures: names present and unique, pointing at exactly the graph inputs/outputs;
- repeats (a warning, not an error): buffers whose bytes repeat another buffer's
  (``circle.dedup``); circle_fx stores each distinct constant once, so a file with repeats
  wastes space. Not checked on an in-memory ``CircleModel``, whose builder already shared them
  (and whose large weights are not in its flatbuffer yet);
- quantization: a quantized tensor is integer-typed, has one scale per tensor or one per
  slice along ``quantizedDimension`` (in range), one zero point per scale (within the type's
  range), and positive finite scales.

All problems are collected and raised together as one :class:`VerifyError`.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from circle_schema import circle

from ..errors import VerifyError
from . import ggml, int4, limits, op_table
from .dims import DYNAMIC, broadcast, fmt as _fmt, numel as _numel, same as _same, same_shape as _same_shape
from .dedup import duplicate_bytes, duplicates
from .ggml import block_type
from .reader import CircleFile, OperatorView, read_circle
from .schema import BO, TT, options_class_name, options_union

Dims = list  # list[int]; dims.DYNAMIC (-1) = dynamic, as everywhere in circle_fx

_MAX_LISTED = 40


@dataclass
class VerifyReport:
    """What a successful :func:`verify` saw (also what ``str()`` prints)."""

    operators: int
    tensors: int
    buffers: int
    constants: int
    inputs: list[str]
    outputs: list[str]
    dynamic: bool
    op_counts: Counter = field(default_factory=Counter)
    shape_checked: int = 0  # operators whose shapes were checked against a rule
    #: buffers whose bytes repeat an earlier buffer's, and the bytes they waste
    duplicate_buffers: int = 0
    duplicate_bytes: int = 0
    #: operators onert 0.1.0 runs wrongly on one of its architectures only (``limits.arch_problems``)
    arch_limits: list = field(default_factory=list)
    #: GATHERs that read a graph input's values as indices, unclamped, with no ``index_range`` for that
    #: input in the file's ``circle_fx.limits`` (``limits.unclamped_index_problem``: a warning)
    unclamped_indices: list = field(default_factory=list)

    def __str__(self) -> str:
        return (f"Circle file OK: {self.operators} operators ({self.shape_checked} shape-checked), "
                f"{self.tensors} tensors, {self.constants} constants, inputs {self.inputs}, "
                f"outputs {self.outputs}" + (", dynamic shapes" if self.dynamic else "")
                + (f"; {self.duplicate_buffers} buffer(s) repeat another's bytes ({self.duplicate_bytes:,} "
                   "bytes could be shared)" if self.duplicate_buffers else "")
                + "".join(f"; {m}" for m in self.arch_limits))


def verify(src) -> VerifyReport:
    """Check a Circle file (path, bytes, or a :class:`CircleModel`) and return a report.

    Raises :class:`VerifyError` whose ``.problems`` lists every problem found.
    """
    in_memory = hasattr(src, "to_bytes") and hasattr(src, "serialized")
    if in_memory:  # a CircleModel
        ser = src.serialized
        # inline: the flatbuffer as built, without filling in large weights (their bytes are not
        # needed to check structure, and filling them would copy every weight)
        src = src.to_bytes() if ser.external else getattr(ser, "flatbuffer", None) or ser.head
    cf = read_circle(src)
    checker = _Checker(cf)
    checker.run()
    for k in range(1, cf.num_subgraphs if not checker.problems else 0):
        # one subgraph per entry point (an LLM package's model.circle: subgraph 0 dispatches
        # through IF, circle_fx/emit/entry_points.py): each is checked as a model of its own
        sub = _Checker(read_circle(src, subgraph=k))
        sub.run()
        checker.problems += [f"subgraph {k}: {p}" for p in sub.problems]
        checker.shape_checked += sub.shape_checked
    if checker.problems:
        name = src if isinstance(src, str) else "Circle model"
        listed = checker.problems[:_MAX_LISTED]
        more = len(checker.problems) - len(listed)
        raise VerifyError(f"{name}: {len(checker.problems)} problem(s):\n  " + "\n  ".join(listed)
                          + (f"\n  ... and {more} more" if more > 0 else ""), checker.problems)
    dups = {} if in_memory else duplicates([b.data for b in cf.buffers])
    if dups:
        import warnings

        name = src if isinstance(src, str) else "Circle model"
        warnings.warn(f"{name}: {len(dups)} constant buffer(s) repeat another buffer's bytes "
                      f"({duplicate_bytes([b.data for b in cf.buffers], dups):,} bytes stored twice)", stacklevel=2)
    arch = limits.arch_problems(op.name for op in cf.operators)
    if arch:
        import warnings

        warnings.warn(f"{src if isinstance(src, str) else 'Circle model'}: " + "; ".join(arch), stacklevel=2)
    unclamped = _unclamped_indices(cf, checker)
    if unclamped:
        import warnings

        warnings.warn(f"{src if isinstance(src, str) else 'Circle model'}: " + "; ".join(unclamped), stacklevel=2)
    t = cf.tensors
    return VerifyReport(arch_limits=arch, unclamped_indices=unclamped,
        duplicate_buffers=len(dups), duplicate_bytes=duplicate_bytes([b.data for b in cf.buffers], dups),
        operators=len(cf.operators), tensors=len(t), buffers=len(cf.buffers),
        constants=sum(1 for x in t if checker.is_const(x.index)),
        inputs=[t[i].name for i in cf.inputs], outputs=[t[i].name for i in cf.outputs],
        dynamic=any(x.shape_signature and -1 in x.shape_signature for x in t),
        op_counts=Counter(op.name for op in cf.operators), shape_checked=checker.shape_checked)


class _Checker:
    def __init__(self, cf: CircleFile):
        self.cf = cf
        self.problems: list[str] = []
        self.shape_checked = 0

    # ------------------------------------------------------------ helpers
    def bad(self, msg: str) -> None:
        self.problems.append(msg)

    def valid_tensor(self, i: int) -> bool:
        return 0 <= i < len(self.cf.tensors)

    def is_const(self, i: int) -> bool:
        t = self.cf.tensors[i]
        if not 0 <= t.buffer < len(self.cf.buffers):
            return False
        b = self.cf.buffers[t.buffer]
        return b.size > 0 or b.data is not None

    def dims(self, i: int) -> Dims:
        t = self.cf.tensors[i]
        sig = t.shape_signature
        if sig is not None and len(sig) == len(t.shape):
            return [DYNAMIC if s < 0 else d for d, s in zip(t.shape, sig)]
        return list(t.shape)

    def tname(self, i: int) -> str:
        return f"tensor {i} {self.cf.tensors[i].name!r}" if self.valid_tensor(i) else f"tensor {i}"

    def const_ints(self, i: int) -> list[int] | None:
        if i < 0 or not self.valid_tensor(i) or not self.is_const(i):
            return None
        try:
            data = self.cf.tensor_data(i)
        except Exception:
            return None
        if data is None or data.dtype.kind not in "iu":
            return None
        return [int(x) for x in np.asarray(data).reshape(-1)]

    # -------------------------------------------------------------- checks
    def run(self) -> None:
        cf = self.cf
        if cf.num_subgraphs != 1 and not any(op.builtin_code == BO.IF for op in cf.operators) and cf.subgraph == 0:
            self.bad(f"model has {cf.num_subgraphs} subgraphs and subgraph 0 calls none of them (no IF): "
                     "circle_fx emits one subgraph, or one per entry point behind an IF")
        self.check_tensors()
        self.check_quantization()
        self.check_buffers()
        structure_ok = self.check_graph_io() & self.check_operators()
        self.check_signatures()
        if structure_ok:
            for op in cf.operators:
                self.check_shapes(op)

    def check_tensors(self) -> None:
        names = Counter(t.name for t in self.cf.tensors)
        for t in self.cf.tensors:
            where = f"tensor {t.index} {t.name!r}"
            if not t.name:
                self.bad(f"tensor {t.index} has no name (onert requires tensor names)")
            elif names[t.name] > 1:
                self.bad(f"{where}: name used by {names[t.name]} tensors")
            if not 0 <= t.buffer < len(self.cf.buffers):
                self.bad(f"{where}: buffer index {t.buffer} out of range (0..{len(self.cf.buffers) - 1})")
            if t.dtype is None and block_type(t.type) is None and not int4.is_int4(t.type):
                self.bad(f"{where}: tensor type {t.type_name} is not one circle_fx emits")
            if int4.is_int4(t.type) and (t.quant_raw is None or not self.is_const(t.index)):
                self.bad(f"{where}: a {t.type_name} tensor must be a constant with quantization parameters "
                         "(circle_fx stores only weights in 4 bits)")
            if len(t.shape) > limits.TENSOR:
                self.bad(f"{where}: rank {len(t.shape)}; onert 0.1.0 crashes on tensors of rank > {limits.TENSOR}")
            if any(d < 0 for d in t.shape):
                self.bad(f"{where}: negative dim in shape {t.shape} (use shape_signature for dynamic dims)")
            sig = t.shape_signature
            if sig is not None:
                if len(sig) != len(t.shape):
                    self.bad(f"{where}: shape_signature {sig} has rank {len(sig)}, shape {t.shape} has {len(t.shape)}")
                elif any(s != -1 and s != d for s, d in zip(sig, t.shape)):
                    self.bad(f"{where}: shape_signature {sig} disagrees with shape {t.shape}")

    def check_quantization(self) -> None:
        for t in self.cf.tensors:
            if t.quant_raw is None:
                continue
            scales, zps, axis = t.quant_raw
            where = f"tensor {t.index} {t.name!r}"
            if t.type not in _QUANT_RANGE:
                self.bad(f"{where}: {t.type_name} tensor carries quantization parameters; only integer "
                         f"tensors ({', '.join(sorted(_QUANT_NAMES))}) are quantized")
            rank = len(t.shape)
            if not (0 <= axis < rank or (axis == 0 and rank == 0)):
                self.bad(f"{where}: quantized dimension {axis} out of range for rank {rank}")
            elif len(scales) != 1 and (rank == 0 or len(scales) != t.shape[axis]):
                self.bad(f"{where}: {len(scales)} scales; expected 1 (per tensor) or "
                         f"{t.shape[axis] if rank else 1} (one per slice along axis {axis})")
            if zps is None or len(zps) != len(scales):
                self.bad(f"{where}: {0 if zps is None else len(zps)} zero points for {len(scales)} scales")
            bad = [s for s in scales if not (math.isfinite(s) and s > 0)]
            if bad:
                self.bad(f"{where}: scales must be positive and finite, got {bad[:4]}")
            lo_hi = _QUANT_RANGE.get(t.type)
            if zps is not None and lo_hi is not None:
                out = [z for z in zps if not lo_hi[0] <= z <= lo_hi[1]]
                if out:
                    self.bad(f"{where}: zero point(s) {out[:4]} outside the {t.type_name} range {list(lo_hi)}")

    def check_buffers(self) -> None:
        for t in self.cf.tensors:
            blocks = block_type(t.type)
            if not 0 <= t.buffer < len(self.cf.buffers) or (t.dtype is None and blocks is None
                                                              and not int4.is_int4(t.type)):
                continue
            b = self.cf.buffers[t.buffer]
            if b.size == 0 and b.data is None:
                continue
            where = f"tensor {t.index} {t.name!r} (buffer {t.buffer})"
            if b.data is None:
                self.bad(f"{where}: external data at offset {b.offset} size {b.size} lies past the end "
                         f"of the file ({self.cf.file_size} bytes)")
                continue
            if t.shape_signature is not None and -1 in t.shape_signature:
                self.bad(f"{where}: a constant cannot have a dynamic shape {t.shape_signature}")
            if blocks is not None:
                if not t.shape or t.shape[-1] % ggml.BLOCK:
                    self.bad(f"{where}: {t.type_name} shape {t.shape} must have a last dim that is a multiple "
                             f"of the block size {ggml.BLOCK}")
                    continue
                want = blocks.nbytes(t.shape)
                if b.size != want:
                    self.bad(f"{where}: buffer holds {b.size} bytes, shape {t.shape} of {t.type_name} needs "
                             f"{want} ({want // blocks.block_bytes} blocks of {blocks.block_bytes} bytes)")
                continue
            if int4.is_int4(t.type):  # two elements per byte (circle/int4.py)
                want = int4.nbytes(t.shape)
                if b.size != want:
                    self.bad(f"{where}: buffer holds {b.size} bytes, shape {t.shape} of {t.type_name} needs "
                             f"{want} (two 4-bit elements per byte)")
                continue
            want = math.prod(t.shape) * t.dtype.itemsize
            if b.size != want:
                self.bad(f"{where}: buffer holds {b.size} bytes, shape {t.shape} of {t.type_name} "
                         f"needs {want}")

    def check_graph_io(self) -> bool:
        ok = True
        for kind, idxs in (("input", self.cf.inputs), ("output", self.cf.outputs)):
            if not idxs:
                self.bad(f"graph has no {kind}s")
            for i in idxs:
                if not self.valid_tensor(i):
                    self.bad(f"graph {kind} tensor index {i} out of range (0..{len(self.cf.tensors) - 1})")
                    ok = False
            if len(set(idxs)) != len(idxs):
                self.bad(f"graph {kind}s {idxs} repeat a tensor")
        for i in self.cf.inputs:
            if self.valid_tensor(i) and self.is_const(i):
                self.bad(f"graph input {self.tname(i)} is a constant (has buffer data)")
        return ok

    def check_operators(self) -> bool:
        cf = self.cf
        ok = True
        available = {i for i in cf.inputs if self.valid_tensor(i)}
        available |= {t.index for t in cf.tensors if self.is_const(t.index)}
        produced_by: dict[int, int] = {}
        for op in cf.operators:
            where = f"operator {op.index} {op.name}"
            opcode_index = op.opcode_index
            if not 0 <= opcode_index < len(cf.opcodes):
                self.bad(f"operator {op.index}: opcode index {opcode_index} out of range "
                         f"(0..{len(cf.opcodes) - 1})")
                ok = False
                continue
            if not op.outputs:
                self.bad(f"{where}: has no outputs")
            for i in op.inputs:
                if i == -1:
                    continue
                if not self.valid_tensor(i):
                    self.bad(f"{where}: input tensor index {i} out of range (0..{len(cf.tensors) - 1})")
                    ok = False
                elif i not in available:
                    later = next((o.index for o in cf.operators[op.index + 1:] if i in o.outputs), None)
                    why = (f"it is produced later by operator {later}" if later is not None
                           else "no operator produces it and it is neither a constant nor a graph input")
                    self.bad(f"{where}: input {self.tname(i)} is used before it is produced ({why})")
            for i in op.outputs:
                if not self.valid_tensor(i):
                    self.bad(f"{where}: output tensor index {i} out of range (0..{len(cf.tensors) - 1})")
                    ok = False
                    continue
                if i in produced_by:
                    self.bad(f"{where}: output {self.tname(i)} already produced by operator {produced_by[i]}")
                elif self.is_const(i):
                    self.bad(f"{where}: output {self.tname(i)} is a constant")
                elif i in cf.inputs:
                    self.bad(f"{where}: output {self.tname(i)} is a graph input")
                produced_by[i] = op.index
                available.add(i)
            self.check_options(op, where)
            self.check_block_uses(op, where)
        readers: dict[int, list[int]] = {}
        tail = limits.tail_start([list(op.outputs) for op in cf.operators], set(cf.outputs))
        for op in cf.operators[:tail]:
            for i in op.inputs:
                readers.setdefault(i, []).append(op.index)
        for i in cf.outputs:
            # an entry point's branch fills the other entry point's IF output slots with zero
            # constants (emit/entry_points.py): a constant output only in a branch subgraph
            if self.valid_tensor(i) and i not in produced_by and not (cf.subgraph > 0 and self.is_const(i)):
                self.bad(f"graph output {self.tname(i)} is not produced by any operator")
            elif (why := limits.output_read_problem(readers.get(i, []))) is not None:
                self.bad(f"graph output {self.tname(i)}: {why}")
        return ok

    def check_block_uses(self, op: OperatorView, where: str) -> None:
        """GGML block tensors only where onert 0.1.0 has a kernel for them (measured): the weight
        (input 1) of a bias-free FULLY_CONNECTED without a fused activation (ignored), or a
        GGML_Q4_0 GATHER table (input 0)."""
        for pos, i in enumerate(op.inputs):
            if not self.valid_tensor(i) or block_type(self.cf.tensors[i].type) is None:
                continue
            t = self.cf.tensors[i]
            if op.builtin_code == BO.FULLY_CONNECTED and pos == 1:  # its input's rank: the ggml_rows form limit
                # a bias input: the ggml_bias form limit (the op table), reported with the shapes
                if self._fused_activation(op):
                    self.bad(f"{where}: a {t.type_name} weight with a fused activation (onert's ggml kernel "
                             "ignores it, measured: benchmarks/onert_fc_activation.py; fuse it into an ADD after)")
            elif not (op.builtin_code == BO.GATHER and pos == 0 and t.type == TT.GGML_Q4_0):
                self.bad(f"{where}: {t.type_name} {self.tname(i)} as input {pos}; onert 0.1.0 reads GGML blocks "
                         "only as a FULLY_CONNECTED weight or a GGML_Q4_0 GATHER table")

    def _fused_activation(self, op: OperatorView) -> int:
        """A FULLY_CONNECTED's fused activation (0 when its options table is absent or another)."""
        if op.raw is None or op.options_type != options_union("FullyConnectedOptions")[1]:
            return 0
        try:
            return self.options(op, "FullyConnectedOptions").FusedActivationFunction()
        except _Skip:
            return 0

    def check_options(self, op: OperatorView, where: str) -> None:
        spec = op_table.row(op.builtin_code)
        kind = spec.options if spec is not None else options_class_name(op.builtin_code)
        if kind is None:
            return
        union, value = options_union(kind)
        got = op.options_type if union == 1 else op.options2_type
        if got != value:
            self.bad(f"{where}: options{'' if union == 1 else '2'} type {got} is not {kind} (onert needs the table)")

    def check_signatures(self) -> None:
        cf = self.cf
        if not cf.signature_inputs and not cf.signature_outputs:
            self.bad("model has no signature def (input/output names)")
            return
        for kind, entries, graph in (("input", cf.signature_inputs, cf.inputs),
                                     ("output", cf.signature_outputs, cf.outputs)):
            names = [n for n, _ in entries]
            if any(not n for n in names):
                self.bad(f"signature {kind} without a name: {entries}")
            dup = sorted(n for n, c in Counter(names).items() if c > 1)
            if dup:
                self.bad(f"signature {kind} names repeat: {dup}")
            idxs = [i for _, i in entries]
            if idxs != list(graph):
                self.bad(f"signature {kind}s point at tensors {idxs}, graph {kind}s are {list(graph)}")

    # -------------------------------------------------------------- shapes
    def check_shapes(self, op: OperatorView) -> None:
        spec = op_table.row(op.builtin_code)
        if spec is None:
            return
        rule = SHAPE_RULES[spec.shape]
        if any(i != -1 and not self.valid_tensor(i) for i in op.inputs + op.outputs):
            return
        self.shape_checked += 1
        try:
            msg = _element_types(self, op) or _rank_limit(self, op, spec) or _form_limits(self, op) or rule(self, op)
        except _Skip:
            return
        except (IndexError, ValueError):  # a rule reads the operands it needs by position
            self.bad(f"operator {op.index} {op.name}: {len(op.inputs)} input(s) and {len(op.outputs)} "
                     "output(s) do not fit this op (an operand it needs is missing or malformed)")
            return
        if msg:
            ins = ", ".join(f"{self.dims(i)}" if i >= 0 else "-" for i in op.inputs)
            outs = ", ".join(f"{self.dims(i)}" for i in op.outputs)
            self.bad(f"operator {op.index} {op.name} ({ins} -> {outs}): {msg}")

    def options(self, op: OperatorView, name: str):
        table = op.raw.BuiltinOptions() if options_union(name)[0] == 1 else op.raw.BuiltinOptions2()
        if table is None:
            raise _Skip()
        mod = getattr(circle, name)
        obj = getattr(mod, name)()
        obj.Init(table.Bytes, table.Pos)
        return obj


#: integer types a quantized tensor may have, with their value ranges (for zero points)
_QUANT_RANGE = {TT.INT8: (-128, 127), TT.UINT8: (0, 255), TT.INT16: (-32768, 32767),
                TT.INT32: (-2**31, 2**31 - 1), TT.INT64: (-2**63, 2**63 - 1)}
_QUANT_RANGE.update({getattr(TT, n): r for n, r in (("INT4", (-8, 7)), ("UINT4", (0, 15))) if hasattr(TT, n)})
_QUANT_NAMES = {n for n in vars(TT) if not n.startswith("_") and getattr(TT, n) in _QUANT_RANGE}


class _Skip(Exception):
    """Not enough information to check (e.g. a non-constant shape operand)."""


# ----------------------------------------------------------------- dim algebra
def _broadcast(shapes: list[Dims]) -> Dims | str:
    """:func:`.dims.broadcast`, or the reason the shapes do not broadcast."""
    try:
        return broadcast(*shapes)
    except ValueError as e:
        return str(e)


def _expect(got: Dims, want: Dims) -> str | None:
    if not _same_shape(got, want):
        return f"output shape {_fmt(got)} should be {_fmt(want)}"
    return None


def _unclamped_indices(cf, c: "_Checker") -> list[str]:
    """One message per GATHER whose integer indices are a graph input's values (through RESHAPE /
    CAST: ``limits.index_source``) along a static table axis, when the file does not declare that
    input's valid ``index_range`` (``circle_fx.limits``: a host that checks ids before running
    needs no clamp; circle_fx's ``index_clamps`` legalization step clamps them otherwise)."""
    producers = {o: (op.name, list(op.inputs)) for op in cf.operators for o in op.outputs}
    names = {i: cf.tensors[i].name for i in cf.inputs}
    declared = (cf.limits or {}).get("inputs") or {}
    out = []
    for op in cf.operators:
        if op.builtin_code != BO.GATHER or len(op.inputs) < 2:
            continue
        src = limits.index_source(op.inputs[1], producers, names)
        if src is None or cf.tensors[op.inputs[1]].type_name not in limits.INDEX_TYPES:
            continue
        if "index_range" in (declared.get(names[src]) or {}):
            continue
        table = c.dims(op.inputs[0])
        try:
            axis = c.options(op, "GatherOptions").Axis()
        except _Skip:
            axis = 0
        rows = table[axis % len(table)] if table and -len(table) <= axis < len(table) else -1
        if rows >= 1:
            out.append(f"operator {op.index} GATHER: {limits.unclamped_index_problem(names[src], rows)}")
    return out


# ---------------------------------------------------------------- shape rules
def _elementwise(c: _Checker, op: OperatorView):
    bad_types = _types(c, op)
    if bad_types:
        return bad_types
    ins = [c.dims(i) for i in op.inputs if i >= 0]
    want = _broadcast(ins)
    if isinstance(want, str):
        return want
    return _expect(c.dims(op.outputs[0]), want)


def _rank_limit(c: _Checker, op: OperatorView, spec) -> str | None:
    """An operand rank beyond what onert runs correctly (the op table's ``rank``)."""
    axes = c.const_ints(op.inputs[1]) if spec.reads_axes and len(op.inputs) > 1 else None
    return op_table.rank_problem(op.name, [c.dims(i) if i >= 0 else [] for i in op.inputs],
                                 c.dims(op.outputs[0]) if op.outputs else [], axes)


def _operand(c: _Checker, i: int) -> op_table.Operand:
    if i < 0:
        return op_table.Operand([], "", False)
    return op_table.Operand(c.dims(i), c.cf.tensors[i].type_name, c.is_const(i))


def _form_limits(c: _Checker, op: OperatorView) -> str | None:
    """A form onert 0.1.0 refuses or miscomputes (the op table's ``forms``), named by its limit:
    the legalization step of that name rewrites it."""
    found = op_table.form_problems(op.name, [_operand(c, i) for i in op.inputs], [_operand(c, i) for i in op.outputs])
    return "; ".join(f"{limit}: {msg}" for limit, msg in found) or None


_COMPARISONS = limits.COMPARISONS


def _types(c: _Checker, op: OperatorView) -> str | None:
    """Operand types an elementwise kernel needs: inputs alike; bool out of comparisons."""
    t = [c.cf.tensors[i].type for i in op.inputs if i >= 0]
    out = c.cf.tensors[op.outputs[0]].type
    name = op.name
    if name == "SELECT_V2":
        cond, t = t[0], t[1:]
        if cond != TT.BOOL:
            return "condition is not BOOL"
    if len(set(t)) > 1:
        return "input types differ: " + ", ".join(c.cf.tensors[i].type_name for i in op.inputs if i >= 0)
    if name in _COMPARISONS:
        return None if out == TT.BOOL else "comparison output is not BOOL"
    if t and out != t[0]:
        return f"output type {c.cf.tensors[op.outputs[0]].type_name} differs from the inputs'"
    return None


def _element_types(c: _Checker, op: OperatorView) -> str | None:
    """An op on an element type onert 0.1.0's kernel does not run (the op table's ``types``):
    the file loads and fails at run time."""
    if op.name not in op_table.ELEMENT_TYPES:
        return None
    data = [op.inputs[p] for p in op_table.data_inputs(op.name, len(op.inputs)) if op.inputs[p] >= 0]
    if any(c.cf.tensors[i].quantization is not None for i in data):
        return None
    bad = op_table.unsupported_type(op.name, [c.cf.tensors[i].type_name for i in data])
    if bad is None:
        return None
    runs = sorted(op_table.ELEMENT_TYPES[op.name][1])
    runs = " and ".join([", ".join(runs[:-1]), runs[-1]] if len(runs) > 1 else runs)
    return f"input type {bad}: onert 0.1.0's {op.name} runs {runs} only"


def _dequantize(c: _Checker, op: OperatorView):
    src, out = c.cf.tensors[op.inputs[0]], c.cf.tensors[op.outputs[0]]
    # INT16: the int16-activation (npu target) files; onert 0.1.0 itself runs no int16 kernel
    if src.type not in (TT.UINT8, TT.INT8, TT.INT16) or src.quantization is None:
        return (f"input {src.name!r} is {src.type_name} without usable quantization; DEQUANTIZE takes "
                "uint8/int8 (and int16)")
    if out.type != TT.FLOAT32:
        return f"output type {out.type_name} is not FLOAT32"
    return _same_as_input(c, op)


def _same_as_input(c: _Checker, op: OperatorView):
    x = c.dims(op.inputs[0])
    return _expect(c.dims(op.outputs[0]), x)


def _rms_norm(c: _Checker, op: OperatorView):
    x = c.dims(op.inputs[0])
    if len(op.inputs) > 1 and op.inputs[1] >= 0:
        g = c.dims(op.inputs[1])
        if len(g) != 1 or not _same(g[0], x[-1]):
            return f"gamma shape {_fmt(g)} should be [{x[-1]}]"
    return _expect(c.dims(op.outputs[0]), x)


def _if(c: _Checker, op: OperatorView):
    """IF (the entry-point dispatch of a multi-subgraph file, emit/entry_points.py): a bool
    one-element condition first, then/else naming other subgraphs of the file."""
    if not op.inputs or c.cf.tensors[op.inputs[0]].type != TT.BOOL or _numel(c.dims(op.inputs[0])) != 1:
        return "the first input (the condition) must be a one-element BOOL tensor"
    o = c.options(op, "IfOptions")
    branches = (o.ThenSubgraphIndex(), o.ElseSubgraphIndex())
    if not all(0 <= b < c.cf.num_subgraphs and b != c.cf.subgraph for b in branches):
        return f"branch subgraphs {branches} are not other subgraphs of the file (0..{c.cf.num_subgraphs - 1})"
    return None


def _rope(c: _Checker, op: OperatorView):
    """onert's ROPE: 4-D x with an even last dim D, inputs (x, sin, cos), 4-D tables ending in D
    (tables of several positions: the op table's form limit, checked before this rule)."""
    if len(op.inputs) != 3:
        return f"{len(op.inputs)} inputs; ROPE takes (x, sin, cos)"
    x = c.dims(op.inputs[0])
    if len(x) != 4 or (x[-1] != DYNAMIC and x[-1] % 2):
        return f"input {_fmt(x)}; onert's ROPE takes a 4-D input with an even last dim"
    for name, i in (("sin", op.inputs[1]), ("cos", op.inputs[2])):
        t = c.dims(i)
        if len(t) != 4 or not _same(t[-1], x[-1]):
            return f"{name} table {_fmt(t)} should be 4-D ending in {x[-1]}"
    return _expect(c.dims(op.outputs[0]), x)


def _fully_connected(c: _Checker, op: OperatorView):
    if len(op.inputs) != 3:
        return f"has {len(op.inputs)} inputs; onert needs 3 (bias -1 when absent)"
    x, w = c.dims(op.inputs[0]), c.dims(op.inputs[1])
    if len(w) != 2:
        return f"weight must be 2-D [out, in], got {_fmt(w)}"
    out_f, in_f = w
    if not _same(x[-1] if x else DYNAMIC, in_f):
        return f"input's last dim {x[-1] if x else None} != weight's in-features {in_f}"
    if op.inputs[2] >= 0:
        b = c.dims(op.inputs[2])
        if len(b) != 1 or not _same(b[0], out_f):
            return f"bias shape {_fmt(b)} should be [{out_f}]"
    keep = bool(c.options(op, "FullyConnectedOptions").KeepNumDims())
    rows = _numel(x[:-1])
    want = x[:-1] + [out_f] if keep else [rows, out_f]
    return _expect(c.dims(op.outputs[0]), want)


def _batch_matmul(c: _Checker, op: OperatorView):
    a, b = c.dims(op.inputs[0]), c.dims(op.inputs[1])
    opts = c.options(op, "BatchMatMulOptions")
    m, ka = (a[-1], a[-2]) if opts.AdjointLhs() else (a[-2], a[-1])
    kb, n = (b[-1], b[-2]) if opts.AdjointRhs() else (b[-2], b[-1])
    if not _same(ka, kb):
        return f"contracted dims differ: {ka} vs {kb}"
    batch = _broadcast([a[:-2], b[:-2]])
    if isinstance(batch, str):
        return "batch " + batch
    return _expect(c.dims(op.outputs[0]), batch + [m, n])


def _reshape(c: _Checker, op: OperatorView):
    x, out = c.dims(op.inputs[0]), c.dims(op.outputs[0])
    nx, no = _numel(x), _numel(out)
    if DYNAMIC not in (nx, no) and nx != no:
        return f"element count changes: {nx} -> {no}"
    target = c.const_ints(op.inputs[1]) if len(op.inputs) > 1 else None
    if target is not None:
        if target.count(-1) > 1:
            return f"shape operand {target} has more than one -1"
        if len(target) != len(out) or any(t != -1 and not _same(o, t) for t, o in zip(target, out)):
            return f"shape operand {target} disagrees with the output shape {_fmt(out)}"
    return None



def _transpose(c: _Checker, op: OperatorView):
    x = c.dims(op.inputs[0])
    perm = c.const_ints(op.inputs[1])
    if perm is None:
        raise _Skip()
    if sorted(perm) != list(range(len(x))):
        return f"perm {perm} is not a permutation of {len(x)} axes"
    return _expect(c.dims(op.outputs[0]), [x[p] for p in perm])


def _concatenation(c: _Checker, op: OperatorView):
    ins = [c.dims(i) for i in op.inputs]
    out = c.dims(op.outputs[0])
    rank = len(out)
    axis = c.options(op, "ConcatenationOptions").Axis()
    if not -rank <= axis < rank:
        return f"axis {axis} out of range for rank {rank}"
    axis %= rank
    total = 0
    for k, s in enumerate(ins):
        if len(s) != rank:
            return f"input {k} has rank {len(s)}, output has {rank}"
        for d in range(rank):
            if d != axis and not _same(s[d], out[d]):
                return f"input {k} dim {d} is {s[d]}, output has {out[d]}"
        total = DYNAMIC if DYNAMIC in (total, s[axis]) else total + s[axis]
    if total != DYNAMIC and not _same(out[axis], total):
        return f"output dim {axis} is {out[axis]}, inputs sum to {total}"
    return None


def _gather(c: _Checker, op: OperatorView):
    params, idx = c.dims(op.inputs[0]), c.dims(op.inputs[1])
    opts = c.options(op, "GatherOptions")
    axis, batch = opts.Axis(), opts.BatchDims()
    if batch != 0:
        raise _Skip()
    if not -len(params) <= axis < len(params):
        return f"axis {axis} out of range for params rank {len(params)}"
    axis %= len(params)
    return _expect(c.dims(op.outputs[0]), params[:axis] + idx + params[axis + 1:])


def _reduce(c: _Checker, op: OperatorView):
    x = c.dims(op.inputs[0])
    rank = len(x)
    axes = c.const_ints(op.inputs[1])
    if axes is None:
        raise _Skip()
    if any(not -rank <= a < rank for a in axes):
        return f"axes {axes} out of range for rank {rank}"
    axes = {a % rank for a in axes}
    src, out = c.cf.tensors[op.inputs[0]], c.cf.tensors[op.outputs[0]]
    if src.type != out.type:
        return f"input type {src.type_name} differs from the output type {out.type_name}"
    keep = bool(c.options(op, "ReducerOptions").KeepDims())
    want = [1 if d in axes else x[d] for d in range(rank)] if keep else [x[d] for d in range(rank) if d not in axes]
    return _expect(c.dims(op.outputs[0]), want)


def _strided_slice(c: _Checker, op: OperatorView):
    x = c.dims(op.inputs[0])
    begin, end = c.const_ints(op.inputs[1]), c.const_ints(op.inputs[2])
    strides = c.const_ints(op.inputs[3]) if len(op.inputs) > 3 else [1] * len(x)
    if begin is None or end is None or strides is None:
        raise _Skip()
    o = c.options(op, "StridedSliceOptions")
    if o.EllipsisMask() or o.NewAxisMask():
        raise _Skip()
    if not len(begin) == len(end) == len(strides) == len(x):
        return f"begin/end/strides lengths {len(begin)}/{len(end)}/{len(strides)} != input rank {len(x)}"
    want = []
    for d, size in enumerate(x):
        s = strides[d]
        if s == 0:
            return f"stride 0 on axis {d}"
        shrink = o.ShrinkAxisMask() >> d & 1
        if size == DYNAMIC:
            if not shrink:
                want.append(DYNAMIC)
            continue
        b = (0 if s > 0 else size - 1) if o.BeginMask() >> d & 1 else begin[d]
        e = (size if s > 0 else -size - 1) if o.EndMask() >> d & 1 else end[d]
        if shrink:
            b = b + size if b < 0 else b
            if not 0 <= b < size:
                return f"shrink index {begin[d]} out of range on axis {d} (size {size})"
            continue
        b, e = (b + size if b < 0 else b), (e + size if e < 0 else e)
        if s > 0:
            b, e = max(0, min(size, b)), max(0, min(size, e))
            want.append(max(0, -(-(e - b) // s)))
        else:
            b, e = max(-1, min(size - 1, b)), max(-1, min(size - 1, e))
            want.append(max(0, -(-(b - e) // -s)))
    return _expect(c.dims(op.outputs[0]), want)


def _slice(c: _Checker, op: OperatorView):
    x = c.dims(op.inputs[0])
    begin, size = c.const_ints(op.inputs[1]), c.const_ints(op.inputs[2])
    if begin is None or size is None:
        raise _Skip()
    if not len(begin) == len(size) == len(x):
        return f"begin/size lengths {len(begin)}/{len(size)} != input rank {len(x)}"
    want = []
    for d, (n, b, s) in enumerate(zip(x, begin, size)):
        if n != DYNAMIC and not (0 <= b <= n and (s == -1 or b + s <= n)):
            return f"axis {d}: begin {b} size {s} out of range for {n}"
        want.append(s if s != -1 else DYNAMIC if n == DYNAMIC else n - b)
    return _expect(c.dims(op.outputs[0]), want)


def _tile(c: _Checker, op: OperatorView):
    x = c.dims(op.inputs[0])
    mult = c.const_ints(op.inputs[1])
    if mult is None:
        raise _Skip()
    if len(mult) != len(x):
        return f"multiples {mult} do not match input rank {len(x)}"
    return _expect(c.dims(op.outputs[0]), [DYNAMIC if d == DYNAMIC else d * m for d, m in zip(x, mult)])


def _pad(c: _Checker, op: OperatorView):
    """PAD / PADV2 (constant value as a third input): paddings is a constant [rank, 2]
    (before, after) per axis."""
    x = c.dims(op.inputs[0])
    pads = c.const_ints(op.inputs[1])
    if pads is None:
        raise _Skip()
    if len(pads) != 2 * len(x):
        return f"paddings of {len(pads)} values do not match input rank {len(x)}"
    return _expect(c.dims(op.outputs[0]),
                   [DYNAMIC if d == DYNAMIC else d + pads[2 * i] + pads[2 * i + 1] for i, d in enumerate(x)])


def _broadcast_to(c: _Checker, op: OperatorView):
    target = c.const_ints(op.inputs[1])
    if target is None:
        raise _Skip()
    want = _broadcast([c.dims(op.inputs[0]), target])
    if isinstance(want, str) or want != target:
        return f"input {_fmt(c.dims(op.inputs[0]))} cannot broadcast to {target}"
    return _expect(c.dims(op.outputs[0]), target)


def _arg_max(c: _Checker, op: OperatorView):
    """ARG_MAX / ARG_MIN: the axis (a 1-element constant) is dropped; the index type is the
    options' ``output_type`` (INT32 or INT64), which the output tensor must have."""
    x = c.dims(op.inputs[0])
    axis = c.const_ints(op.inputs[1])
    if axis is None:
        raise _Skip()
    if len(axis) != 1 or not -len(x) <= axis[0] < len(x):
        return f"axis {axis} is not one axis of a rank-{len(x)} input"
    a = axis[0] % len(x)
    name = "ArgMaxOptions" if op.name == "ARG_MAX" else "ArgMinOptions"
    out = c.cf.tensors[op.outputs[0]]
    want_type = c.options(op, name).OutputType()
    if want_type not in (TT.INT32, TT.INT64):
        return f"output_type {want_type} is neither INT32 nor INT64"
    if out.type != want_type:
        return f"output tensor type {out.type_name} differs from the options' output_type"
    return _expect(c.dims(op.outputs[0]), x[:a] + x[a + 1:])


def has_rule(code: int) -> bool:
    """Whether :func:`verify` checks the shapes of operators with builtin ``code``."""
    return op_table.row(code) is not None


def _conv_2d(c: _Checker, op: OperatorView):
    """NHWC input, OHWI filter, bias [O] (onert needs it); output [N, H', W', O]."""
    if len(op.inputs) != 3 or op.inputs[2] < 0:
        return f"has {len(op.inputs)} inputs / no bias; onert's CONV_2D needs input, filter and bias"
    x, f, b = c.dims(op.inputs[0]), c.dims(op.inputs[1]), c.dims(op.inputs[2])
    if len(x) != 4 or len(f) != 4:
        return f"input {_fmt(x)} and filter {_fmt(f)} must be 4-D (NHWC, OHWI)"
    if not _same(x[3], f[3]):
        return f"input channels {x[3]} != filter in-channels {f[3]}"
    if len(b) != 1 or not _same(b[0], f[0]):
        return f"bias shape {_fmt(b)} should be [{f[0]}]"
    return _conv_output(c, op, c.options(op, "Conv2DOptions"), x, f, f[0])


def _conv_output(c: _Checker, op: OperatorView, o, x, f, channels):
    """CONV_2D and DEPTHWISE_CONV_2D alike: strides and dilations (options ``o``) at least 1,
    and the NHWC output of input ``x`` under filter ``f`` (``[., kH, kW, .]``) with ``channels``."""
    sh, sw, dh, dw = o.StrideH(), o.StrideW(), o.DilationHFactor(), o.DilationWFactor()
    if min(sh, sw, dh, dw) < 1:
        return f"strides {sh}x{sw} / dilations {dh}x{dw} must be >= 1"
    same = o.Padding() == circle.Padding.Padding.SAME
    return _expect(c.dims(op.outputs[0]), [x[0], _window_out(x[1], f[1], sh, dh, same),
                                           _window_out(x[2], f[2], sw, dw, same), channels])


def _window_out(size, k, s, d, same):
    """Output length of a sliding window (kernel ``k``, stride ``s``, dilation ``d``) under
    Circle's SAME or VALID padding; DYNAMIC when unknown."""
    if DYNAMIC in (size, k):
        return DYNAMIC
    return -(-size // s) if same else (size - (k - 1) * d - 1) // s + 1


def _depthwise_conv_2d(c: _Checker, op: OperatorView):
    """NHWC input, filter [1, kH, kW, C * depthMultiplier], bias [C * depthMultiplier]."""
    if len(op.inputs) != 3 or op.inputs[2] < 0:
        return f"has {len(op.inputs)} inputs / no bias; DEPTHWISE_CONV_2D needs input, filter and bias"
    x, f, b = c.dims(op.inputs[0]), c.dims(op.inputs[1]), c.dims(op.inputs[2])
    if len(x) != 4 or len(f) != 4 or f[0] != 1:
        return f"input {_fmt(x)} must be NHWC and filter {_fmt(f)} [1, kH, kW, C*M]"
    o = c.options(op, "DepthwiseConv2DOptions")
    m = o.DepthMultiplier()
    if DYNAMIC not in (x[3], f[3]) and x[3] * m != f[3]:
        return f"input channels {x[3]} x depthMultiplier {m} != filter channels {f[3]}"
    if len(b) != 1 or not _same(b[0], f[3]):
        return f"bias shape {_fmt(b)} should be [{f[3]}]"
    return _conv_output(c, op, o, x, f, f[3])


def _pool_2d(c: _Checker, op: OperatorView):
    """MAX_POOL_2D / AVERAGE_POOL_2D: NHWC in and out, window and strides from Pool2DOptions."""
    x = c.dims(op.inputs[0])
    if len(x) != 4:
        return f"input {_fmt(x)} must be 4-D (NHWC)"
    o = c.options(op, "Pool2DOptions")
    kh, kw, sh, sw = o.FilterHeight(), o.FilterWidth(), o.StrideH(), o.StrideW()
    if min(kh, kw, sh, sw) < 1:
        return f"window {kh}x{kw} / strides {sh}x{sw} must be >= 1"
    same = o.Padding() == circle.Padding.Padding.SAME
    return _expect(c.dims(op.outputs[0]), [x[0], _window_out(x[1], kh, sh, 1, same),
                                           _window_out(x[2], kw, sw, 1, same), x[3]])


def _split(c: _Checker, op: OperatorView):
    """inputs (axis, x); ``numSplits`` equal pieces along the axis."""
    axis = c.const_ints(op.inputs[0])
    if axis is None:
        raise _Skip()
    x = c.dims(op.inputs[1])
    n = c.options(op, "SplitOptions").NumSplits()
    if n != len(op.outputs):
        return f"numSplits {n} != {len(op.outputs)} outputs"
    a = axis[0]
    if not -len(x) <= a < len(x):
        return f"axis {a} out of range for rank {len(x)}"
    a %= len(x)
    if x[a] != DYNAMIC and x[a] % n:
        return f"dim {a} of size {x[a]} does not split into {n} equal pieces"
    want = list(x)
    want[a] = DYNAMIC if x[a] == DYNAMIC else x[a] // n
    for k, t in enumerate(op.outputs):
        msg = _expect(c.dims(t), want)
        if msg:
            return f"output {k}: {msg}"
    return None


#: the shape rules the Circle op table (``circle/op_table.py``) names, by name
SHAPE_RULES = {"elementwise": _elementwise, "same_as_input": _same_as_input, "dequantize": _dequantize,
               "rms_norm": _rms_norm, "rope": _rope, "fully_connected": _fully_connected,
               "batch_matmul": _batch_matmul, "reshape": _reshape, "transpose": _transpose,
               "concatenation": _concatenation, "gather": _gather, "reduce": _reduce,
               "strided_slice": _strided_slice, "slice": _slice, "tile": _tile, "pad": _pad,
               "broadcast_to": _broadcast_to, "arg_max": _arg_max, "conv_2d": _conv_2d, "split": _split,
               "depthwise_conv_2d": _depthwise_conv_2d, "pool_2d": _pool_2d, "if": _if}

