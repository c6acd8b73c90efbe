"""Serialising a :class:`ModelBuilder` into Circle bytes, with weights streamed.

Two layouts:

- *inline* (default below 2 GB): each buffer's bytes belong inside the flatbuffer,
  16-byte aligned so the runtime can map them as float arrays. The builder works in an
  anonymous ``mmap`` (zero pages cost nothing until touched) and large weights are not
  copied into it at all: their vectors are left as zero-filled holes and
  :class:`Serialized` writes the numpy arrays into those holes while streaming the file
  (no ``tobytes``, no Python lists, no second copy of the weights in memory);
- *external* (automatic above the 2 GB flatbuffer limit, or on request): the flatbuffer
  holds only ``Buffer.offset``/``Buffer.size``; the data follows the flatbuffer in the
  same file, each buffer aligned, and is written directly from the numpy arrays.

Either way a :class:`Serialized` describes the file without materialising it, so
``save`` streams and only ``to_bytes`` builds one big ``bytes`` object.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field

import flatbuffers
import numpy as np
from circle_schema import circle

from ..circle.schema import QuantParams, default_options, options_union
from .builder import ModelBuilder, Stacked

FLATBUFFER_LIMIT = 2**31 - 1
#: headroom kept below the 2 GB limit for tables and strings when choosing the layout
_INLINE_BUDGET = FLATBUFFER_LIMIT - (64 << 20)
ALIGN = 64
FILE_IDENTIFIER = b"CIR0"
#: inline weights at least this big are written into their hole at save time, not copied
_HOLE_MIN_BYTES = 4096


@dataclass
class Serialized:
    """A Circle file: the flatbuffer, then (external layout) aligned weight segments.

    ``holes`` are ``(offset, array)`` pairs for inline weight vectors whose bytes are
    still zero in the flatbuffer; ``write_to`` streams the arrays into place, and
    :attr:`head` fills them in memory only when someone asks for the complete bytes.
    """

    flatbuffer: memoryview
    segments: list[tuple[int, np.ndarray]] = field(default_factory=list)
    holes: list[tuple[int, np.ndarray]] = field(default_factory=list)

    @property
    def head(self) -> memoryview:
        """The complete flatbuffer (inline weights filled in; one copy, done on first use)."""
        for off, arr in self.holes:
            _put(self.flatbuffer, off, arr)
        self.holes = []
        return self.flatbuffer

    @property
    def size(self) -> int:
        if not self.segments:
            return len(self.flatbuffer)
        off, arr = self.segments[-1]
        return off + arr.nbytes

    @property
    def external(self) -> bool:
        return bool(self.segments)

    def write_to(self, f) -> None:
        """Stream the file: flatbuffer pieces, weights straight from numpy, padding. O(bytes)."""
        pos = 0
        for off, arr in self.holes:
            f.write(self.flatbuffer[pos:off])
            for view in _chunks(arr):
                f.write(view)
            pos = off + arr.nbytes
        f.write(self.flatbuffer[pos:])
        pos = len(self.flatbuffer)
        for off, arr in self.segments:
            if off > pos:
                f.write(b"\0" * (off - pos))
            for view in _chunks(arr):
                f.write(view)
            pos = off + arr.nbytes

    def to_bytes(self) -> bytes:
        if not self.segments and not self.holes:
            return bytes(self.flatbuffer)
        out = bytearray(self.size)
        out[: len(self.flatbuffer)] = self.flatbuffer
        for off, arr in self.holes + self.segments:
            _put(out, off, arr)
        return bytes(out)


def _bytes_view(arr: np.ndarray) -> memoryview:
    arr = np.ascontiguousarray(arr)
    return memoryview(arr.reshape(-1).view(np.uint8))


def _chunks(arr):
    """The bytes of a buffer as views, in order: one for an array, one per part of a
    :class:`~circle_fx.emit.builder.Stacked` (streamed without concatenating; a lazy one's parts
    are read from the checkpoint one at a time, each dropped before the next is read)."""
    if not isinstance(arr, Stacked):
        yield _bytes_view(arr)
        return
    for p in arr.chunks():
        yield _bytes_view(p)


def _put(dst, off: int, arr) -> None:
    for view in _chunks(arr):
        dst[off: off + len(view)] = view
        off += len(view)


class _Prebuilt:
    """Stands in for a ``BufferT`` whose table was already written to the builder."""

    def __init__(self, offset: int):
        self.offset = offset

    def Pack(self, builder) -> int:  # noqa: N802 - flatbuffers' object API name
        return self.offset


def serialize(mb: ModelBuilder, external: bool | None = None, description: str = "circle_fx") -> Serialized:
    weights = mb.weight_bytes()
    if external is None:
        external = weights > _INLINE_BUDGET
    if not external:
        holes: list = []
        flat = _pack(mb, description, offsets=None, reserve=_inline_size_estimate(mb), holes=holes)
        return Serialized(flat, holes=holes)
    # metadata (circle_fx.limits) stays inline: onert reads metadata buffers' data at load and
    # fails on an external one (measured: NNFW_STATUS_ERROR)
    inline = set(mb.metadata.values())
    consts = [(i, b) for i, b in enumerate(mb.buffers) if b is not None and i not in inline]
    placeholder = {i: 1 for i, _ in consts}  # non-zero so the fields are present
    head_len = len(_pack(mb, description, offsets=placeholder, reserve=_tables_size_estimate(mb)))
    offsets, pos = {}, head_len
    for i, arr in consts:
        pos = (pos + ALIGN - 1) // ALIGN * ALIGN
        offsets[i] = pos
        pos += arr.nbytes
    head = _pack(mb, description, offsets=offsets, reserve=_tables_size_estimate(mb))
    assert len(head) == head_len, "flatbuffer size changed between layout passes"
    return Serialized(head, [(offsets[i], arr) for i, arr in consts])


def _inline_size_estimate(mb: ModelBuilder) -> int:
    """An upper estimate of the inline flatbuffer's size, so the builder never grows.

    ``flatbuffers.Builder`` grows by allocating twice the size and copying everything,
    which for a 500 MB model cost seconds and a transient 3x of the weights; reserving
    the weights plus generous per-table room up front avoids every regrowth. O(tensors).
    """
    return mb.weight_bytes() + _tables_size_estimate(mb)


def _tables_size_estimate(mb: ModelBuilder) -> int:
    graphs = [mb, *getattr(mb, "subgraphs", ())]
    tables = sum(len(t.name) + 8 * len(t.shape) + 96 for g in graphs for t in g.tensors)
    tables += sum(8 * (len(op.inputs) + len(op.outputs)) + 160 for g in graphs for op in g.operators)
    return 32 * len(mb.buffers) + tables + (1 << 16)


def _mmap_builder(size: int) -> flatbuffers.Builder:
    """A builder over an anonymous mmap: untouched pages (the weight holes) use no RAM."""
    size = min(flatbuffers.Builder.MAX_BUFFER_SIZE, max(4096, size))
    b = flatbuffers.Builder(0)
    b.Bytes = mmap.mmap(-1, size)
    b.head = size
    return b


def _pack(mb: ModelBuilder, description: str, offsets: dict | None, reserve: int,
          holes: list | None = None) -> memoryview:
    """Build the flatbuffer. With ``holes`` given, large inline weights are not copied:
    ``(file offset, array)`` pairs for them are appended to ``holes`` instead. O(tensors + ops)
    plus one copy of the small constants."""
    C = circle
    b = _mmap_builder(reserve)
    pending = []
    buffer_tables = []
    for i, arr in enumerate(mb.buffers):
        if arr is None:
            C.Buffer.BufferStart(b)
            buffer_tables.append(_Prebuilt(C.Buffer.BufferEnd(b)))
            continue
        if offsets is None or i not in offsets:  # inline (external layout: metadata stays inline)
            data = _vector(b, arr, pending if holes is not None and offsets is None else None)
            C.Buffer.BufferStart(b)
            C.Buffer.BufferAddData(b, data)
        else:
            C.Buffer.BufferStart(b)
            C.Buffer.BufferAddOffset(b, offsets[i])
            C.Buffer.BufferAddSize(b, arr.nbytes)
        buffer_tables.append(_Prebuilt(C.Buffer.BufferEnd(b)))

    # an LLM package's model.circle: subgraph 0 dispatches to one subgraph per entry point
    # (emit/entry_points.py); they share mb.buffers
    graphs = [(mb, "main", "serving_default")] + [(g, g.name, g.name) for g in getattr(mb, "subgraphs", ())]
    codes, code_index = [], {}
    for op in (op for g, _, _ in graphs for op in g.operators):
        if op.code not in code_index:
            oc = C.OperatorCode.OperatorCodeT()
            oc.builtinCode = op.code
            oc.deprecatedBuiltinCode = op.code if op.code < 127 else 127
            oc.version = 1
            code_index[op.code] = len(codes)
            codes.append(oc)
    subgraphs, signatures = [], []
    for k, (g, name, key) in enumerate(graphs):
        sg = C.SubGraph.SubGraphT()
        sg.tensors = [_Prebuilt(_tensor(b, t)) for t in g.tensors]
        sg.operators = [_Prebuilt(_operator(b, op, code_index[op.code])) for op in g.operators]
        sg.inputs, sg.outputs, sg.name = g.inputs, g.outputs, name
        subgraphs.append(sg)
        sig = C.SignatureDef.SignatureDefT()
        sig.signatureKey = getattr(mb, "main_signature", key) if k == 0 else key
        sig.subgraphIndex = k
        sig.inputs = [_tensor_map(n, i) for n, i in zip(g.input_names, g.inputs)]
        sig.outputs = [_tensor_map(n, i) for n, i in zip(g.output_names, g.outputs)]
        signatures.append(sig)

    m = C.Model.ModelT()
    m.version = 0
    m.description = description
    m.operatorCodes = codes
    m.subgraphs = subgraphs
    m.buffers = buffer_tables
    m.signatureDefs = signatures
    if mb.metadata:
        m.metadata = []
        for name, buffer in mb.metadata.items():
            entry = C.Metadata.MetadataT()
            entry.name, entry.buffer = name, buffer
            m.metadata.append(entry)
    b.Finish(m.Pack(b), file_identifier=FILE_IDENTIFIER)
    start = b.Head()
    if holes is not None:
        end = len(b.Bytes)  # positions were recorded from the end: valid even if the builder grew
        holes.extend(sorted(((end - from_end - start, arr) for from_end, arr in pending), key=lambda h: h[0]))
    return memoryview(b.Bytes)[start:]


def _quantization(q: QuantParams):
    qp = circle.QuantizationParameters.QuantizationParametersT()
    qp.scale = list(q.scale)
    qp.zeroPoint = list(q.zero_point)
    qp.quantizedDimension = q.axis
    return qp


def _ints(b: flatbuffers.Builder, values) -> int:
    """An int32 vector in one ``pack_into`` (the object API prepends element by element)."""
    n = len(values)
    b.StartVector(4, n, 4)
    b.head = b.head - 4 * n
    struct.pack_into(f"<{n}i", b.Bytes, b.head, *values)
    return b.EndVector()


def _tensor(b: flatbuffers.Builder, t) -> int:
    """A Tensor table written with the builder directly: the object API's ``TensorT.Pack``
    also adds every default-valued field (skipped by the builder anyway) and prepends vector
    elements one call each, which made tables most of the serialisation time."""
    T = circle.Tensor
    shape = _ints(b, t.shape)
    name = b.CreateString(t.name)
    quant = _quantization(t.quantization).Pack(b) if t.quantization is not None else None
    sig = _ints(b, t.shape_signature) if t.shape_signature is not None else None
    T.TensorStart(b)
    T.TensorAddShape(b, shape)
    T.TensorAddType(b, t.type)
    T.TensorAddBuffer(b, t.buffer)
    T.TensorAddName(b, name)
    if quant is not None:
        T.TensorAddQuantization(b, quant)
    if sig is not None:
        T.TensorAddShapeSignature(b, sig)
    return T.TensorEnd(b)


def _operator(b: flatbuffers.Builder, op, opcode_index: int) -> int:
    """An Operator table written with the builder directly (see :func:`_tensor`)."""
    O = circle.Operator
    inputs, outputs = _ints(b, op.inputs), _ints(b, op.outputs)
    if op.options is None:
        op.options = default_options(op.code)
    union = kind = options = None
    if op.options is not None:
        union, kind = options_union(type(op.options).__name__[:-1])  # AddOptionsT -> AddOptions
        options = op.options.Pack(b)
    O.OperatorStart(b)
    O.OperatorAddOpcodeIndex(b, opcode_index)
    O.OperatorAddInputs(b, inputs)
    O.OperatorAddOutputs(b, outputs)
    if union == 1:
        O.OperatorAddBuiltinOptionsType(b, kind)
        O.OperatorAddBuiltinOptions(b, options)
    elif union is not None:
        O.OperatorAddBuiltinOptions2Type(b, kind)
        O.OperatorAddBuiltinOptions2(b, options)
    return O.OperatorEnd(b)


def _tensor_map(name: str, index: int):
    tm = circle.TensorMap.TensorMapT()
    tm.name = name
    tm.tensorIndex = index
    return tm


def _vector(b: flatbuffers.Builder, arr: np.ndarray, pending: list | None = None) -> int:
    """Write ``arr``'s bytes as a ubyte vector, 16-byte aligned, with at most one copy.

    With ``pending`` given, a large array is not copied: its (zero) region is reserved
    and ``(distance from the buffer's end, arr)`` recorded so the writer streams it in
    later (the builder grows at the front, so only end-relative positions stay valid).
    """
    n = arr.nbytes
    b.StartVector(1, n, 16)
    b.head = b.head - n
    if pending is not None and n >= _HOLE_MIN_BYTES:
        pending.append((len(b.Bytes) - b.head, arr))
    else:
        _put(b.Bytes, b.head, arr)
    return b.EndVector()


def write_atomic(path: str | os.PathLike, data: Serialized, check=None) -> None:
    """Write to ``path.tmp-PID`` then rename, so a crash never leaves half a model.
    ``check(tmp_path)``, when given, runs on the complete temp file before the rename
    (a file it rejects is removed, never renamed into place)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            data.write_to(f)
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
