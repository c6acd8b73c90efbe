"""Reading Circle files back: a flat, typed view used by ``inspect``, ``verify`` and tests.

Uses circle_schema's generated accessors directly (not the object API), so buffer data is
returned as zero-copy numpy views of the file bytes and large models read quickly.
External buffers (``Buffer.offset``/``size``) are resolved against the same file bytes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
from circle_schema import circle

from ..errors import VerifyError
from .safe_read import check_flatbuffer
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
    raw: object = None  # circle.Operator.Operator, for option details

    @property
    def name(self) -> str:
        return op_name(self.builtin_code)


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
        """The constant data of tensor ``index`` as a typed numpy array, or None."""
        t = self.tensors[index]
        b = self.buffers[t.buffer] if 0 <= t.buffer < len(self.buffers) else None
        if b is None or b.data is None or t.dtype is None:
            return None
        return b.data.view(t.dtype).reshape(t.shape)


def file_bytes(src) -> bytes | memoryview:
    if isinstance(src, (bytes, bytearray, memoryview)):
        return memoryview(src)
    path = os.fspath(src)
    if not os.path.exists(path):
        raise VerifyError(f"{path}: no such file")
    return memoryview(np.memmap(path, dtype=np.uint8, mode="r")) if os.path.getsize(path) else memoryview(b"")


def _quantization(t) -> tuple[QuantParams | None, tuple | None]:
    """``(params, raw)``: the tensor's scale/zero point (None when it has none: a
    QuantizationParameters table with no scales, as some writers leave on float tensors,
    carries nothing; None too when the counts disagree) and the raw values as written."""
    q = t.Quantization()
    if q is None or q.ScaleIsNone() or not q.ScaleLength():
        return None, None
    scale = tuple(float(x) for x in q.ScaleAsNumpy())
    zp = tuple(int(x) for x in q.ZeroPointAsNumpy()) if not q.ZeroPointIsNone() and q.ZeroPointLength() else None
    raw = (scale, zp, q.QuantizedDimension())
    try:
        return QuantParams(scale, zp if zp is not None else (0,) * len(scale), raw[2]), raw
    except ValueError:
        return None, raw


def read_circle(src) -> CircleFile:
    """Parse a Circle file (path, bytes or memoryview) into a :class:`CircleFile`.

    A file that is not a well-formed Circle flatbuffer raises :class:`VerifyError` (naming
    the path when ``src`` is one), never a lower-level exception."""
    if isinstance(src, (bytes, bytearray, memoryview)):
        return _read(src)
    path = os.fspath(src)
    try:
        return _read(path)
    except VerifyError as e:
        if str(e).startswith(path):
            raise
        raise VerifyError(f"{path}: {e}", getattr(e, "problems", None)) from None


def _read(src) -> CircleFile:
    buf = file_bytes(src)
    if len(buf) < 8:
        raise VerifyError(f"not a Circle file: only {len(buf)} bytes")
    raw = bytes(buf[:8])
    if raw[4:8] not in (b"CIR0", b"TFL3"):
        raise VerifyError(f"not a Circle file: identifier {raw[4:8]!r}")
    check_flatbuffer(buf)  # after this, the generated accessors below read only inside the file
    try:
        m = circle.Model.Model.GetRootAs(buf, 0)
        opcodes = []
        for i in range(m.OperatorCodesLength()):
            oc = m.OperatorCodes(i)
            code = oc.BuiltinCode()
            dep = oc.DeprecatedBuiltinCode()
            opcodes.append(code if code >= 127 or code < 0 else dep if dep != 127 else code)
        buffers = []
        for i in range(m.BuffersLength()):
            b = m.Buffers(i)
            off, size = b.Offset(), b.Size()
            if off > 1:
                data = np.frombuffer(buf, dtype=np.uint8, count=size, offset=off) if off + size <= len(buf) else None
                buffers.append(BufferView(i, size, off, data))
            elif not b.DataIsNone() and b.DataLength():
                data = b.DataAsNumpy()
                buffers.append(BufferView(i, int(data.size), 0, data))
            else:
                buffers.append(BufferView(i, 0, 0, None))
        sg = m.Subgraphs(0)
        tensors = []
        for i in range(sg.TensorsLength()):
            t = sg.Tensors(i)
            sig = [int(x) for x in t.ShapeSignatureAsNumpy()] if not t.ShapeSignatureIsNone() else None
            shape = [int(x) for x in t.ShapeAsNumpy()] if not t.ShapeIsNone() else []
            name = t.Name().decode() if t.Name() is not None else ""
            tensors.append(TensorView(i, name, shape, sig, t.Type(), t.Buffer(), *_quantization(t)))
        operators = []
        for i in range(sg.OperatorsLength()):
            o = sg.Operators(i)
            idx = o.OpcodeIndex()
            code = opcodes[idx] if 0 <= idx < len(opcodes) else -10_000
            ins = [int(x) for x in o.InputsAsNumpy()] if not o.InputsIsNone() else []
            outs = [int(x) for x in o.OutputsAsNumpy()] if not o.OutputsIsNone() else []
            operators.append(OperatorView(i, code, ins, outs, o.BuiltinOptionsType(),
                                          o.BuiltinOptions2Type(), o))
        sig_in, sig_out = [], []
        if m.SignatureDefsLength():
            sd = m.SignatureDefs(0)
            sig_in = [(sd.Inputs(j).Name().decode(), sd.Inputs(j).TensorIndex()) for j in range(sd.InputsLength())]
            sig_out = [(sd.Outputs(j).Name().decode(), sd.Outputs(j).TensorIndex()) for j in range(sd.OutputsLength())]
        metadata = {}
        for i in range(m.MetadataLength()):
            entry = m.Metadata(i)
            k = entry.Buffer()
            data = buffers[k].data if k < len(buffers) else None
            metadata[(entry.Name() or b"").decode(errors="replace")] = None if data is None else bytes(data)
        return CircleFile(
            metadata=metadata,
            version=m.Version(),
            description=(m.Description() or b"").decode(errors="replace"),
            tensors=tensors, operators=operators, buffers=buffers, opcodes=opcodes,
            inputs=[int(x) for x in sg.InputsAsNumpy()] if not sg.InputsIsNone() else [],
            outputs=[int(x) for x in sg.OutputsAsNumpy()] if not sg.OutputsIsNone() else [],
            signature_inputs=sig_in, signature_outputs=sig_out,
            num_subgraphs=m.SubgraphsLength(), file_size=len(buf))
    except VerifyError:
        raise
    except Exception as e:
        raise VerifyError(f"Circle flatbuffer could not be parsed: {type(e).__name__}: {e}") from e
