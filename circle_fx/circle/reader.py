"""Reading Circle files back: a flat, typed view used by ``inspect``, ``verify`` and tests.

Reads the tables with ``struct`` over the file bytes (:class:`_Flat`, after the bounds-checked walk
of ``safe_read``), not through the generated accessors' per-field objects, so buffer data is
returned as zero-copy numpy views of the file bytes and large models read quickly.
External buffers (``Buffer.offset``/``size``) are resolved against the same file bytes.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np
from circle_schema import circle

from ..errors import VerifyError
from .safe_read import check_flatbuffer, fields
from . import int4
from .schema import CIRCLE_TO_NUMPY, QuantParams, op_name, type_name

#: the Circle metadata entry holding circle_fx's run-time limits (JSON; emit/index_limits.py)
LIMITS_METADATA = "circle_fx.limits"


@dataclass
class TensorView:
    index: int
    name: str
    shape: list[int]
    shape_signature: list[int] | None
    type: int  # circle TensorType
    buffer: int
    quantization: QuantParams | None = None
    #: the file's ``(scales, zero points or None, quantizedDimension)`` as written, even when
    #: inconsistent (then ``quantization`` is None); what ``verify`` checks
    quant_raw: tuple | None = None

    @property
    def dtype(self):
        return CIRCLE_TO_NUMPY.get(self.type)

    @property
    def type_name(self) -> str:
        return type_name(self.type)


@dataclass
class OperatorView:
    index: int
    builtin_code: int
    inputs: list[int]
    outputs: list[int]
    options_type: int
    options2_type: int = 0
    opcode_index: int = 0  # as written (``builtin_code`` is -10000 when it is out of range)
    _at: tuple | None = field(default=None, repr=False, compare=False)  # (file bytes, table position)

    @property
    def name(self) -> str:
        return op_name(self.builtin_code)

    @property
    def raw(self):
        """The generated ``circle.Operator.Operator`` accessor, for option details (None when
        not read from a file); made on demand: most readers need only the fields above."""
        if self._at is None:
            return None
        o = circle.Operator.Operator()
        o.Init(*self._at)
        return o


@dataclass
class BufferView:
    index: int
    size: int
    offset: int  # 0 when inline
    data: np.ndarray | None  # uint8 view, None when empty


@dataclass
class CircleFile:
    version: int
    description: str
    tensors: list[TensorView]
    operators: list[OperatorView]
    buffers: list[BufferView]
    opcodes: list[int]
    inputs: list[int]
    outputs: list[int]
    signature_inputs: list[tuple[str, int]] = field(default_factory=list)
    signature_outputs: list[tuple[str, int]] = field(default_factory=list)
    num_subgraphs: int = 1
    file_size: int = 0
    #: which subgraph ``tensors``/``operators``/``inputs``/``outputs`` are (``read_circle(subgraph=k)``)
    subgraph: int = 0
    #: ``(key, subgraph index)`` of every SignatureDef, in file order
    signatures: list = field(default_factory=list)
    #: Circle metadata entries: name -> the bytes of the buffer it names (None if out of range)
    metadata: dict = field(default_factory=dict)

    @property
    def limits(self) -> dict | None:
        """The file's ``circle_fx.limits`` (valid index ranges, dynamic dims' maxima,
        ``max_seq_len``; see circle_fx/emit/index_limits.py), or None without one."""
        import json

        raw = self.metadata.get(LIMITS_METADATA)
        try:
            value = json.loads(bytes(raw).decode()) if raw is not None else None
        except (UnicodeDecodeError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def tensor_data(self, index: int) -> np.ndarray | None:
        """The constant data of tensor ``index`` as a typed numpy array, or None. A 4-bit
        tensor's elements come unpacked (:mod:`circle_fx.circle.int4`)."""
        t = self.tensors[index]
        b = self.buffers[t.buffer] if 0 <= t.buffer < len(self.buffers) else None
        if b is None or b.data is None:
            return None
        if int4.is_int4(t.type):  # two elements per byte: int8 (INT4) / uint8 (UINT4) values
            return int4.unpack(b.data, t.shape, t.type)
        if t.dtype is None:
            return None
        return b.data.view(t.dtype).reshape(t.shape)


def file_bytes(src) -> bytes | memoryview:
    if isinstance(src, (bytes, bytearray, memoryview)):
        return memoryview(src)
    path = os.fspath(src)
    if not os.path.exists(path):
        raise VerifyError(f"{path}: no such file")
    return memoryview(np.memmap(path, dtype=np.uint8, mode="r")) if os.path.getsize(path) else memoryview(b"")


def read_circle(src, subgraph: int = 0) -> CircleFile:
    """Parse a Circle file (path, bytes or memoryview) into a :class:`CircleFile`: the model's
    tables and subgraph ``subgraph`` (0: the one onert runs; an LLM package's ``model.circle``
    has one per entry point, circle_fx/emit/entry_points.py), with the SignatureDef naming it.

    A file that is not a well-formed Circle flatbuffer raises :class:`VerifyError` (naming
    the path when ``src`` is one), never a lower-level exception."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        return _read(src, subgraph)
    path = os.fspath(src)
    try:
        return _read(path, subgraph)
    except VerifyError as e:
        if str(e).startswith(path):
            raise
        raise VerifyError(f"{path}: {e}", getattr(e, "problems", None)) from None


class _Flat:
    """Field reads of a flatbuffer that :func:`check_flatbuffer` passed, straight from the bytes.

    The generated accessors build a Python object per table and go through several calls per
    field; reading a 125M model back with them cost more than the checks themselves. Here a
    table is its position plus its vtable (one ``struct`` read) and a field one more read, with
    slots, formats and defaults from the schema (:func:`safe_read.fields`). No bounds checks:
    the walk already proved every field, vector and string of every reachable table lies
    inside the buffer."""

    def __init__(self, buf):
        self.buf = buf
        self._vt: dict[int, struct.Struct] = {}

    def table(self, pos: int) -> tuple[int, tuple]:
        buf = self.buf
        vt = pos - _I32.unpack_from(buf, pos)[0]
        n = _U16.unpack_from(buf, vt)[0] // 2
        unpack = self._vt.get(n)
        if unpack is None:
            unpack = self._vt[n] = struct.Struct(f"<{n}H")
        return pos, unpack.unpack_from(buf, vt)

    @staticmethod
    def _at(tab, f) -> int:
        """The field's byte position, 0 when absent."""
        k = f.slot // 2
        o = tab[1][k] if k < len(tab[1]) else 0
        return tab[0] + o if o else 0

    def scalar(self, tab, f):
        p = self._at(tab, f)
        return struct.unpack_from("<" + f.fmt, self.buf, p)[0] if p else f.default

    def _target(self, tab, f) -> int:
        p = self._at(tab, f)
        return p + _U32.unpack_from(self.buf, p)[0] if p else 0

    def sub(self, tab, f):
        """A sub-table field, or None."""
        t = self._target(tab, f)
        return self.table(t) if t else None

    def vector(self, tab, f) -> list | None:
        """A scalar vector field as a list (None when absent)."""
        t = self._target(tab, f)
        if not t:
            return None
        n = _U32.unpack_from(self.buf, t)[0]
        return list(struct.unpack_from(f"<{n}{f.fmt}", self.buf, t + 4))

    def bytes_view(self, tab, f) -> np.ndarray | None:
        """A ubyte vector field as a zero-copy numpy view (None when absent)."""
        t = self._target(tab, f)
        if not t:
            return None
        return np.frombuffer(self.buf, dtype=np.uint8, count=_U32.unpack_from(self.buf, t)[0], offset=t + 4)

    def string(self, tab, f) -> bytes | None:
        t = self._target(tab, f)
        if not t:
            return None
        n = _U32.unpack_from(self.buf, t)[0]
        return bytes(self.buf[t + 4: t + 4 + n])

    def tables(self, tab, f) -> list:
        """A vector-of-tables field as a list of tables ([] when absent)."""
        t = self._target(tab, f)
        if not t:
            return []
        n = _U32.unpack_from(self.buf, t)[0]
        return [self.table(t + 4 + 4 * k + off)
                for k, off in enumerate(struct.unpack_from(f"<{n}I", self.buf, t + 4))]


_I32, _U32, _U16 = struct.Struct("<i"), struct.Struct("<I"), struct.Struct("<H")


def _read(src, subgraph: int = 0) -> CircleFile:
    buf = file_bytes(src)
    if len(buf) < 8:
        raise VerifyError(f"not a Circle file: only {len(buf)} bytes")
    raw = bytes(buf[:8])
    if raw[4:8] not in (b"CIR0", b"TFL3"):
        raise VerifyError(f"not a Circle file: identifier {raw[4:8]!r}")
    check_flatbuffer(buf)  # after this, every read below stays inside the file
    try:
        return _parse(_Flat(buf), len(buf), subgraph)
    except VerifyError:
        raise
    except Exception as e:
        raise VerifyError(f"Circle flatbuffer could not be parsed: {type(e).__name__}: {e}") from e


def _parse(r: _Flat, size: int, subgraph: int = 0) -> CircleFile:
    M, OC, B, SG, T, O, Q = (fields(n) for n in ("Model", "OperatorCode", "Buffer", "SubGraph", "Tensor",
                                                 "Operator", "QuantizationParameters"))
    m = r.table(_U32.unpack_from(r.buf, 0)[0])
    opcodes = []
    for oc in r.tables(m, M["OperatorCodes"]):
        code, dep = r.scalar(oc, OC["BuiltinCode"]), r.scalar(oc, OC["DeprecatedBuiltinCode"])
        opcodes.append(code if code >= 127 or code < 0 else dep if dep != 127 else code)
    buffers = []
    for i, b in enumerate(r.tables(m, M["Buffers"])):
        off, n = r.scalar(b, B["Offset"]), r.scalar(b, B["Size"])
        if off > 1:
            data = np.frombuffer(r.buf, dtype=np.uint8, count=n, offset=off) if off + n <= size else None
            buffers.append(BufferView(i, n, off, data))
            continue
        data = r.bytes_view(b, B["Data"])
        buffers.append(BufferView(i, int(data.size), 0, data) if data is not None and data.size
                       else BufferView(i, 0, 0, None))
    subgraphs = r.tables(m, M["Subgraphs"])
    if not subgraphs:
        raise IndexError("the model has no subgraph")
    sg = subgraphs[subgraph]
    tensors = []
    for i, t in enumerate(r.tables(sg, SG["Tensors"])):
        name = r.string(t, T["Name"])
        tensors.append(TensorView(i, name.decode() if name is not None else "", r.vector(t, T["Shape"]) or [],
                                  r.vector(t, T["ShapeSignature"]), r.scalar(t, T["Type"]),
                                  r.scalar(t, T["Buffer"]), *_quantization(r, r.sub(t, T["Quantization"]), Q)))
    operators = []
    for i, o in enumerate(r.tables(sg, SG["Operators"])):
        idx = r.scalar(o, O["OpcodeIndex"])
        operators.append(OperatorView(i, opcodes[idx] if 0 <= idx < len(opcodes) else -10_000,
                                      r.vector(o, O["Inputs"]) or [], r.vector(o, O["Outputs"]) or [],
                                      r.scalar(o, O["BuiltinOptionsType"]), r.scalar(o, O["BuiltinOptions2Type"]),
                                      opcode_index=idx, _at=(r.buf, o[0])))
    sig_in, sig_out = [], []
    sigs = r.tables(m, M["SignatureDefs"])
    signatures = []
    if sigs:
        SD, TM = fields("SignatureDef"), fields("TensorMap")
        signatures = [((r.string(d, SD["SignatureKey"]) or b"").decode(errors="replace"),
                       r.scalar(d, SD["SubgraphIndex"])) for d in sigs]
        # the signature naming this subgraph (a one-subgraph file: its only one, whatever its index says)
        mine = next((d for d, (_, k) in zip(sigs, signatures) if k == subgraph), sigs[0] if subgraph == 0 else None)

        def entries(key):  # a missing name decodes like the accessor's None.decode(): an error
            return [(_decode(r.string(e, TM["Name"])), r.scalar(e, TM["TensorIndex"]))
                    for e in r.tables(mine, SD[key])]
        if mine is not None:
            sig_in, sig_out = entries("Inputs"), entries("Outputs")
    metadata = {}
    MD = fields("Metadata")
    for entry in r.tables(m, M["Metadata"]):
        k = r.scalar(entry, MD["Buffer"])
        data = buffers[k].data if k < len(buffers) else None
        metadata[(r.string(entry, MD["Name"]) or b"").decode(errors="replace")] = None if data is None else bytes(data)
    return CircleFile(
        metadata=metadata, version=r.scalar(m, M["Version"]),
        description=(r.string(m, M["Description"]) or b"").decode(errors="replace"),
        tensors=tensors, operators=operators, buffers=buffers, opcodes=opcodes,
        inputs=r.vector(sg, SG["Inputs"]) or [], outputs=r.vector(sg, SG["Outputs"]) or [],
        signature_inputs=sig_in, signature_outputs=sig_out, num_subgraphs=len(subgraphs), file_size=size,
        subgraph=subgraph, signatures=signatures)


def _decode(raw: bytes | None) -> str:
    if raw is None:
        raise ValueError("a signature entry has no name")
    return raw.decode()


def _quantization(r: _Flat, q, Q) -> tuple[QuantParams | None, tuple | None]:
    """``(params, raw)``: the tensor's scale/zero point (None when it has none: a
    QuantizationParameters table with no scales, as some writers leave on float tensors,
    carries nothing; None too when the counts disagree) and the raw values as written."""
    if q is None:
        return None, None
    scale = r.vector(q, Q["Scale"])
    if not scale:
        return None, None
    zp = r.vector(q, Q["ZeroPoint"]) or None
    raw = (tuple(scale), tuple(zp) if zp is not None else None, r.scalar(q, Q["QuantizedDimension"]))
    try:
        return QuantParams(raw[0], raw[1] if zp is not None else (0,) * len(scale), raw[2]), raw
    except ValueError:
        return None, raw
