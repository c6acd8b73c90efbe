"""Accumulates a Circle subgraph: tensors, constant buffers, operator codes, operators.

Constants are kept as numpy arrays (views of the torch tensors, no copies) until the
writer streams them out; identical storage is stored once while emitting, and
:meth:`ModelBuilder.share_buffers` then stores every repeated constant once (one buffer,
several tensors: a tied embedding read as a GATHER table and as a CONV_2D filter, each
layer's copy of the causal mask and RoPE tables).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..circle.dedup import duplicate_bytes, duplicates
from ..circle.schema import BO, CIRCLE_TO_NUMPY, NUMPY_TO_CIRCLE, QuantParams, op_name  # noqa: F401  (BO, op_name re-exported)
from ..errors import UnsupportedOpError


class Stacked:
    """A constant buffer made of arrays stacked along dim 0, never concatenated in memory:
    the writer streams ``parts`` one after the other (``chunks``). What a
    :class:`~circle_fx.program.StackedTensor` (merged linear weights) becomes when emitted.
    ``np.asarray`` of it concatenates (a copy), for the rare reader that needs the values."""

    def __init__(self, parts: list[np.ndarray]):
        self.parts = [np.ascontiguousarray(p) for p in parts]
        self.dtype = self.parts[0].dtype
        self.shape = (sum(p.shape[0] for p in self.parts), *self.parts[0].shape[1:])
        self.nbytes = sum(p.nbytes for p in self.parts)

    def chunks(self) -> list[np.ndarray]:
        return self.parts

    def __array__(self, dtype=None, copy=None):
        out = np.concatenate(self.parts, 0)
        return out if dtype is None else out.astype(dtype)


class LazyParts(Stacked):
    """A :class:`Stacked` buffer whose parts are :class:`~circle_fx.lazy.LazyTensor` constants
    (a float checkpoint weight, or a merged one's members): nothing is read until the writer
    streams it, one part at a time (``chunks`` yields each part's values and drops them), so a
    float32 export from a checkpoint never holds its weights together. Not compared by
    ``share_buffers`` (that would read them): a tied weight is one constant anyway."""

    def __init__(self, parts: list, to_array):
        self.parts, self._to_array = list(parts), to_array
        self.dtype = np.dtype(to_array(None, parts[0].dtype))
        self.shape = (sum(int(p.shape[0]) for p in parts), *(int(d) for d in parts[0].shape[1:]))
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize

    def chunks(self):
        for p in self.parts:
            yield self._to_array(p, None)

    def __array__(self, dtype=None, copy=None):
        out = np.concatenate(list(self.chunks()), 0)
        return out if dtype is None else out.astype(dtype)


@dataclass
class TensorInfo:
    name: str
    shape: list[int]
    type: int
    buffer: int = 0
    shape_signature: list[int] | None = None
    #: affine quantization of the stored values (None: a plain float/int tensor)
    quantization: QuantParams | None = None


@dataclass
class OperatorInfo:
    code: int
    inputs: list[int]
    outputs: list[int]
    options: object = None
    source: str = ""

    @property
    def where(self) -> str:
        """`` at model.py:12`` (the model line it was lowered from) for a message, or ``""``."""
        return f" at {self.source}" if self.source else ""

    def unsupported(self, message: str) -> UnsupportedOpError:
        """The export-time error for this operator (``message`` places :attr:`where`), naming
        the op and its model line for the report: never a file that fails or miscomputes."""
        return UnsupportedOpError(message, [(op_name(self.code), "", self.source or "")])


@dataclass
class ModelBuilder:
    tensors: list[TensorInfo] = field(default_factory=list)
    #: buffer 0 is the mandatory empty sentinel; others hold numpy arrays
    buffers: list[np.ndarray | Stacked | None] = field(default_factory=lambda: [None])
    operators: list[OperatorInfo] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    #: ``{(input name, dim): largest size}`` a lowering is exact up to (CircleModel.run checks it)
    input_limits: dict = field(default_factory=dict)
    #: ``(buffers merged, bytes saved)`` by :meth:`share_buffers`
    shared: tuple = (0, 0)
    #: ``{input name: (lo, hi)}`` valid values of an integer input that indexes a GATHER
    #: (emit/index_limits.py)
    index_ranges: dict = field(default_factory=dict)
    #: Circle metadata entries ``{name: buffer index}`` (``circle_fx.limits``)
    metadata: dict = field(default_factory=dict)
    #: the ``circle_fx.limits`` JSON stored in the file (emit/index_limits.py), None before
    limits: dict | None = None
    _buffer_keys: dict = field(default_factory=dict)
    _names: set = field(default_factory=set)

    @classmethod
    def from_file(cls, cf) -> "ModelBuilder":
        """The builder view of a Circle file read back (``circle.reader.CircleFile``), for
        ``CircleModel.load``: tensors, operators, graph inputs/outputs with their signature
        names; constant buffers stay views of the file bytes."""
        names = {i: n for n, i in cf.signature_inputs + cf.signature_outputs}
        mb = cls(tensors=[TensorInfo(t.name, list(t.shape), t.type, t.buffer, t.shape_signature, t.quantization)
                          for t in cf.tensors],
                 buffers=[b.data if b.data is not None and b.size else None for b in cf.buffers] or [None],
                 operators=[OperatorInfo(op.builtin_code, list(op.inputs), list(op.outputs)) for op in cf.operators],
                 inputs=list(cf.inputs), outputs=list(cf.outputs))
        mb.input_names = [names.get(i, cf.tensors[i].name) for i in cf.inputs]
        mb.output_names = [names.get(i, cf.tensors[i].name) for i in cf.outputs]
        mb._names = {t.name for t in cf.tensors}
        limits = mb.limits = cf.limits or {}
        for name, entry in (limits.get("inputs") or {}).items():
            if isinstance(entry, dict):
                rng = entry.get("index_range")
                if isinstance(rng, list) and len(rng) == 2:
                    mb.index_ranges[name] = (int(rng[0]), int(rng[1]))
                for dim, largest in (entry.get("max_dims") or {}).items():
                    mb.input_limits[(name, int(dim))] = int(largest)
        return mb

    def _unique(self, name: str) -> str:
        base, i = name, 1
        while name in self._names:
            name = f"{base}_{i}"
            i += 1
        self._names.add(name)
        return name

    def add_tensor(self, name: str, shape, ctype: int, buffer: int = 0, shape_signature=None,
                   quantization: QuantParams | None = None) -> int:
        self.tensors.append(TensorInfo(self._unique(name), [int(d) for d in shape], ctype, buffer,
                                       list(shape_signature) if shape_signature is not None else None,
                                       quantization))
        return len(self.tensors) - 1

    def add_buffer(self, array: np.ndarray, key=None) -> int:
        if key is not None and key in self._buffer_keys:
            return self._buffer_keys[key]
        self.buffers.append(array if isinstance(array, Stacked) else np.ascontiguousarray(array))
        idx = len(self.buffers) - 1
        if key is not None:
            self._buffer_keys[key] = idx
        return idx

    def add_constant(self, name: str, array: np.ndarray, key=None, quantization: QuantParams | None = None) -> int:
        array = np.asarray(array)
        if key is None:
            key = ("bytes", array.dtype.str, array.shape, array.tobytes()) if array.nbytes <= 256 else None
        buf = self.add_buffer(array, key)
        return self.add_tensor(name, array.shape, NUMPY_TO_CIRCLE[array.dtype], buf, quantization=quantization)

    def add_operator(self, code: int, inputs, outputs, options=None, source: str = "") -> None:
        self.operators.append(OperatorInfo(code, list(inputs), list(outputs), options, source))

    def dims(self, t: int) -> list[int]:
        """Dims of tensor ``t``, -1 where dynamic (its shape_signature when it has one)."""
        info = self.tensors[t]
        return list(info.shape_signature if info.shape_signature is not None else info.shape)

    def values(self, t: int) -> np.ndarray:
        """Constant ``t``'s values, read as its own type and shape (a buffer may be shared by
        an alias of another type)."""
        info = self.tensors[t]
        data, want = np.asarray(self.buffers[info.buffer]), CIRCLE_TO_NUMPY[info.type]
        return (data if data.dtype == want else data.view(want)).reshape(info.shape)

    def reshaped(self, t: int, dims: list[int], hint: list[int] | None = None, name: str | None = None,
                 source: str = "") -> tuple[int, list[OperatorInfo]]:
        """Tensor ``t`` viewed as ``dims`` (-1 dynamic; ``hint`` the example sizes for the
        ``shape`` field), same type and quantization, and the operators that make the view:
        none when ``t`` already has those dims or is a constant (a second tensor over its
        buffer), else one RESHAPE. The caller places the operators (a lowering appends them, a
        rewrite splices them in before the operator that reads the view)."""
        dims = [int(d) for d in dims]
        if self.dims(t) == dims:
            return t, []
        info = self.tensors[t]
        shape = [h if d == -1 else d for d, h in zip(dims, hint or [1] * len(dims))]
        name = name or f"{info.name}/reshaped"
        if info.buffer:
            return self.add_tensor(name, shape, info.type, info.buffer, None, info.quantization), []
        r = self.add_tensor(name, shape, info.type, 0, dims if -1 in dims else None, info.quantization)
        target = self.add_constant(f"{name}/shape", np.asarray(dims, np.int32))
        return r, [OperatorInfo(BO.RESHAPE, [t, target], [r], None, source)]

    def like(self, t: int, dims: list[int], hint: list[int] | None = None, name: str | None = None) -> int:
        """A new run-time tensor of ``t``'s type and quantization shaped ``dims`` (-1 dynamic;
        ``hint`` the example sizes for the ``shape`` field): the intermediate of a rewrite."""
        dims, info = [int(d) for d in dims], self.tensors[t]
        shape = [h if d == -1 else d for d, h in zip(dims, hint or [1] * len(dims))]
        return self.add_tensor(name or f"{info.name}/folded", shape, info.type, 0, dims if -1 in dims else None,
                               info.quantization)

    def reshape_into(self, src: int, dst: int, source: str = "") -> OperatorInfo:
        """The RESHAPE of ``src`` into existing tensor ``dst`` (to ``dst``'s dims): the last
        operator of a rewrite that ran an operator on other dims."""
        target = self.add_constant(f"{self.tensors[dst].name}/fold_shape", np.asarray(self.dims(dst), np.int32))
        return OperatorInfo(BO.RESHAPE, [src, target], [dst], None, source)

    def rewrite_operators(self, rewrite) -> int:
        """Replace each operator ``op`` for which ``rewrite(op)`` returns a list of operators
        by that list (None keeps ``op``), in place; return how many were replaced. The
        legalization steps (``emit/legalize/``: types, ranks) are such rewrites."""
        ops: list[OperatorInfo] = []
        replaced = 0
        for op in self.operators:
            new = rewrite(op)
            if new is None:
                ops.append(op)
            else:
                ops.extend(new)
                replaced += 1
        self.operators = ops
        return replaced

    def share_buffers(self) -> int:
        """Point every tensor whose constant bytes repeat another buffer's at that buffer and
        drop the repeats (buffers renumbered, order kept); return the bytes saved. Sharing is
        always valid: a buffer is raw bytes, each tensor keeps its own shape and type. Run
        once the graph is final (legalization adds constants too), before writing."""
        dups = duplicates(self.buffers)
        if not dups:
            return 0
        saved = duplicate_bytes(self.buffers, dups)
        renumber, kept = {}, []
        for i, arr in enumerate(self.buffers):
            if i not in dups:
                renumber[i] = len(kept)
                kept.append(arr)
        for t in self.tensors:
            t.buffer = renumber[dups.get(t.buffer, t.buffer)]
        self.metadata = {k: renumber[dups.get(v, v)] for k, v in self.metadata.items()}
        self._buffer_keys = {k: renumber[dups.get(v, v)] for k, v in self._buffer_keys.items()}
        self.buffers = kept
        self.shared = (self.shared[0] + len(dups), self.shared[1] + saved)
        return saved

    def constants(self) -> list[np.ndarray]:
        """The constant buffers (weights), without the metadata ones (``circle_fx.limits``)."""
        meta = set(self.metadata.values())
        return [b for i, b in enumerate(self.buffers) if b is not None and i not in meta]

    def weight_bytes(self) -> int:
        return sum(b.nbytes for b in self.constants())
