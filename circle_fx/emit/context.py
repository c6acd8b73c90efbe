"""What a lowering function sees: FX values mapped to Circle tensors, and tensor info.

``ctx.tensor(value)`` gives the Circle tensor for an FX node, a folded constant, or a
Python scalar (materialised as a constant of the right dtype); ``ctx.output(node)``
creates the tensor for a node's result; ``ctx.op`` appends an operator.

Quantization slot: a node (or constant) whose ``meta[QUANT_META]`` holds a
:class:`~circle_fx.circle.schema.QuantParams` gets those parameters on its Circle tensor.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.fx as fx

from ..circle import int4
from ..circle.schema import BO, CIRCLE_TO_NUMPY, TT, QuantParams
from ..errors import UnsupportedOpError
from ..fx_utils import dtype_of, val
from ..lazy import is_lazy
from ..meta import QUANT_META, STORAGE_4BIT
from ..program import Program, StackedTensor, fetch_attr
from ..source import op_name, source_line
from .builder import LazyParts, ModelBuilder, Stacked

#: a lazy constant at least this big is streamed from its checkpoint by the writer (smaller ones,
#: norm gammas, are read while lowering: not worth a buffer of their own kind)
_LAZY_MIN_BYTES = 1 << 16
from .types import TORCH_TO_CIRCLE, circle_type, numpy_dtype, to_numpy



def quantization_of(node) -> QuantParams | None:
    """The quantization a pass attached to ``node`` (None: a plain tensor)."""
    return getattr(node, "meta", {}).get(QUANT_META)


class NodeInfo:
    """What is known about FX values before any Circle exists: dims (-1 dynamic), example
    sizes, rank, dtype, quantization. The registry's refusal checks get one; every lowering's
    ``ctx`` is one too."""

    def __init__(self, node: fx.Node | None = None):
        self.node = node  # node being lowered or checked (for messages)

    def dims(self, value, item: int | None = None, static: bool = False) -> list[int]:
        """``value``'s dims, -1 for each dynamic one (``item``: element of a tuple-valued node).

        ``static=True`` raises a clear error instead when a dim is dynamic, for lowerings that
        need every size at compile time."""
        v = _fake(value, item)
        dims = [d if isinstance(d, int) else -1 for d in v.shape]
        if static and -1 in dims:
            name = value.name if isinstance(value, fx.Node) else "value"
            raise self.error(f"%{name} has a dynamic shape {list(v.shape)}, "
                             f"which {op_name(self.node.target)} cannot lower yet")
        return dims

    def shape_hint(self, value, item: int | None = None) -> list[int]:
        """``value``'s traced example sizes (a dynamic dim's hint; static dims as they are)."""
        return _shape_and_signature(_fake(value, item))[0]

    def rank(self, value) -> int:
        return len(_fake(value, None).shape)

    def is_dynamic(self, value) -> bool:
        return -1 in self.dims(value)

    def dtype(self, value, item: int | None = None) -> torch.dtype:
        return dtype_of(value) if item is None else _fake(value, item).dtype

    def quantization(self, value) -> QuantParams | None:
        return quantization_of(value)

    def error(self, message: str) -> UnsupportedOpError:
        n = self.node
        if n is None:
            return UnsupportedOpError(message)
        target = op_name(n.target) if n.op == "call_function" else n.op
        return UnsupportedOpError(f"{target} (%{n.name}) at {source_line(n)}: {message}",
                                  [(target, n.name, source_line(n))])

    def where(self, node=None) -> str:
        n = node or self.node
        return f"%{n.name} at {source_line(n)}" if n is not None else ""


class LoweringContext(NodeInfo):
    """The one seam between a lowering and the rest of circle_fx.

    Dims follow one convention everywhere: ``ctx.dims(v)`` is a ``list[int]`` with ``-1`` for
    a dynamic dim (exactly Circle's ``shape_signature``); ``ctx.shape_hint(v)`` gives the
    example sizes torch.export traced with, for the few places that need a number even for a
    dynamic dim (the ``shape`` field of a tensor). Constants come from ``ctx.constant(node)``;
    dtype, rank and quantization from ``ctx.dtype``, ``ctx.rank``, ``ctx.quantization``.
    Lowerings use only these (``tests/lowerings/test_lowering_seam.py`` checks): the program and the
    builder stay private to the context, so their layout can change without touching lowerings.
    """

    def __init__(self, program: Program, builder: ModelBuilder):
        super().__init__(None)
        self.program = program
        self.builder = builder
        self.values: dict[fx.Node, int] = {}
        self._packed: dict[tuple, int] = {}  # (constant, block type, shape) -> tensor (packed_const)

    @property
    def shared_weights(self) -> bool:
        """Other entry points of the file read this program's constants too (``Program.shared_weights``:
        export_llm's one-file package), so a lowering picks forms that hold a weight once."""
        return self.program.shared_weights

    # --------------------------------------------------------------- tensors
    def tensor(self, value, dtype: torch.dtype | None = None) -> int:
        """Tensor index for an FX node or a Python scalar (``dtype`` picks the scalar's type)."""
        if isinstance(value, fx.Node):
            if value in self.values:
                return self.values[value]
            if value.op == "get_attr":
                t = fetch_attr(self.program.gm, value.target)
                four = value.meta.get(STORAGE_4BIT)
                idx = self.const_tensor(t, value.target, quantization_of(value)) if four is None else \
                    self._int4_tensor(t, value.target, getattr(TT, four), quantization_of(value))
                self.values[value] = idx
                return idx
            if isinstance(val(value), torch.SymInt):
                raise self.error(f"%{value.name} is the run-time size of a dynamic dim; using it as a tensor "
                                 "value (e.g. arithmetic on x.shape[1]) is not supported")
            raise self.error(f"value %{value.name} is used before it is computed")
        if isinstance(value, (bool, int, float)):
            dt = dtype or (torch.bool if isinstance(value, bool) else
                           torch.int64 if isinstance(value, int) else torch.float32)
            return self.const(np.array(value, dtype=numpy_dtype(dt)), "scalar")
        raise self.error(f"cannot use {type(value).__name__} {value!r} as a tensor")

    def numpy_dtype(self, dtype: torch.dtype):
        """The numpy dtype of a constant of ``dtype`` (an UnsupportedOpError naming the node for a
        dtype Circle has no type for): what a lowering outside ``emit`` builds constants with."""
        return numpy_dtype(dtype, self.where())

    def operand(self, value, dtype: torch.dtype) -> int:
        """Tensor for ``value`` in ``dtype``: a node CAST when its dtype differs, a Python scalar
        materialised in ``dtype`` (what a lowering writes for an input of a fixed element type)."""
        if not isinstance(value, fx.Node):
            return self.tensor(value, dtype)
        idx = self.tensor(value)
        if self.dtype(value) == dtype:
            return idx
        out = self.like(value, f"{value.name}_cast", dtype)
        self.op(BO.CAST, [idx], [out])
        return out

    def constant(self, value) -> torch.Tensor | None:
        """The folded tensor behind a constant node (``get_attr``); None for anything else."""
        if isinstance(value, fx.Node) and value.op == "get_attr":
            return fetch_attr(self.program.gm, value.target)
        return None

    def const_tensor(self, t: torch.Tensor, name: str, quantization: QuantParams | None = None) -> int:
        parts = t.parts if isinstance(t, StackedTensor) else [t]
        if any(is_lazy(p) for p in parts) and t.dim() > 0 and t.numel() * t.element_size() >= _LAZY_MIN_BYTES:
            key = ("lazy", tuple(p.key if is_lazy(p) else id(p) for p in parts))  # a tied weight: one buffer
            arr = LazyParts(parts, lambda p, dt, where=f"constant {name}": (
                numpy_dtype(dt, where) if p is None else to_numpy(p, where)))
            buf = self.builder.add_buffer(arr, key)
            return self.builder.add_tensor(name, arr.shape, circle_type(t.dtype), buf, quantization=quantization)
        if isinstance(t, StackedTensor):  # written part by part, never concatenated in memory
            arr = Stacked([to_numpy(p, f"constant {name}") for p in t.parts])
            buf = self.builder.add_buffer(arr)
            return self.builder.add_tensor(name, arr.shape, circle_type(t.dtype), buf, quantization=quantization)
        arr = to_numpy(t, f"constant {name}")
        key = None
        if t.is_contiguous() and arr.nbytes > 256 and not is_lazy(t):
            key = ("storage", t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        buf = self.builder.add_buffer(arr, key)
        return self.builder.add_tensor(name, arr.shape, circle_type(t.dtype), buf, quantization=quantization)

    def _int4_tensor(self, t: torch.Tensor, name: str, tensor_type: int, quantization) -> int:
        """The integers ``t`` (int8 / uint8 values in the 4-bit range) as an ``INT4`` / ``UINT4``
        tensor of the same shape, two elements per byte (``circle/int4.py``)."""
        try:
            packed = int4.pack(to_numpy(t, f"constant {name}"), tensor_type)
        except ValueError as e:
            raise self.error(f"constant {name}: {e}") from None
        return self.builder.add_tensor(name, list(t.shape), tensor_type, self.builder.add_buffer(packed),
                                       quantization=quantization)

    def packed_const(self, value, circle_type: int, shape, name: str | None = None) -> int:
        """Constant ``value`` (a uint8 tensor of raw blocks, e.g. GGML Q4_0) as a Circle tensor of
        ``shape`` and block type ``circle_type``: the same bytes, a different element type. Two
        uses of one constant under one type (a tied weight read by FULLY_CONNECTED and GATHER)
        get one tensor; the buffer is shared in any case."""
        if not (isinstance(value, fx.Node) and value.op == "get_attr"):
            raise self.error(f"packed weights must be a constant, got {value}")
        key = (value, circle_type, tuple(shape))
        if key not in self._packed:
            t = fetch_attr(self.program.gm, value.target)
            arr = to_numpy(t, f"constant {value.target}")
            storage = None if is_lazy(t) or not t.is_contiguous() else (
                "storage", t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
            buf = self.builder.add_buffer(arr, storage)
            self._packed[key] = self.builder.add_tensor(name or value.target, [int(d) for d in shape], circle_type, buf)
        return self._packed[key]

    def const(self, array, name: str = "const", quantization: QuantParams | None = None) -> int:
        return self.builder.add_constant(f"{self._prefix()}{name}", np.asarray(array), quantization=quantization)

    def int_const(self, values, name: str = "shape") -> int:
        return self.const(np.asarray(values, dtype=np.int32), name)

    def new_tensor(self, dims, dtype: torch.dtype, name: str = "t", hint=None,
                   quantization: QuantParams | None = None) -> int:
        """An intermediate tensor of ``dims`` (-1 = dynamic). ``hint`` gives the example size
        of each dynamic dim (default 1) for the Circle ``shape`` field; ``quantization`` the
        parameters of an integer tensor."""
        dims = [int(d) for d in dims]
        if -1 not in dims:
            shape, sig = dims, None
        else:
            hint = hint if hint is not None else [1] * len(dims)
            shape, sig = [h if d == -1 else d for d, h in zip(dims, hint)], dims
        return self.builder.add_tensor(f"{self._prefix()}{name}", shape, circle_type(dtype, self.where()), 0, sig,
                                       quantization=quantization)

    def like(self, node, name: str = "t", dtype: torch.dtype | None = None,
             quantization: QuantParams | None = None) -> int:
        """An intermediate tensor shaped like ``node`` (dynamic dims included)."""
        return self.new_tensor(self.dims(node), dtype or self.dtype(node), name, self.shape_hint(node), quantization)

    def alias(self, index: int, dtype: torch.dtype, name: str, quantization: QuantParams | None = None) -> int:
        """A second tensor over constant ``index``'s buffer, read as ``dtype`` (same item size):
        one stored copy of bytes that two ops need under different types (a tied int8 weight
        that GATHER must read as uint8)."""
        t = self.builder.tensors[index]
        if not t.buffer:
            raise self.error(f"tensor {t.name!r} is not a constant; only constants can be aliased")
        return self.builder.add_tensor(f"{self._prefix()}{name}", t.shape, circle_type(dtype, self.where()),
                                       t.buffer, quantization=quantization)

    def shape_operand(self, target) -> int:
        """int32 shape constant for RESHAPE to ``target``: a node (its dims) or a dims list.

        A dynamic dim becomes -1, which RESHAPE infers at run time; only one dim can be
        inferred, so a shape with two dynamic dims raises a clear error.
        """
        dims = self.dims(target) if isinstance(target, fx.Node) else [int(d) for d in target]
        if dims.count(-1) > 1:
            raise self.error(f"reshaping to {dims} needs more than one dynamic dim (-1) inferred at run "
                             "time, which Circle's RESHAPE cannot do; mark at most one of these dims dynamic")
        return self.int_const(dims)

    def reshaped(self, index: int, dims, hint=None, name: str = "reshaped") -> int:
        """Circle tensor ``index`` as ``dims`` (-1 dynamic, at most one; ``hint`` the example
        sizes): ``index`` itself when it has those dims, a view of a constant's buffer, else a
        RESHAPE into a new tensor of the same type and quantization."""
        dims = [int(d) for d in dims]
        if dims.count(-1) > 1 and self.builder.dims(index) != dims:
            self.shape_operand(dims)  # raises the two-dynamic-dims error
        out, ops = self.builder.reshaped(index, dims, hint, f"{self._prefix()}{name}",
                                         source_line(self.node) if self.node is not None else "")
        self.builder.operators.extend(ops)
        return out

    def output(self, node: fx.Node | None = None) -> int:
        """The tensor that holds ``node``'s result (created on first use)."""
        node = node or self.node
        if node in self.values:
            return self.values[node]
        v = val(node)
        if not isinstance(v, torch.Tensor):
            raise self.error(f"%{node.name} does not produce a tensor")
        shape, sig = _shape_and_signature(v)
        idx = self.builder.add_tensor(node.name, shape, circle_type(v.dtype, self.where(node)), 0, sig,
                                      quantization=quantization_of(node))
        self.values[node] = idx
        return idx

    def outputs(self, node: fx.Node, wanted=None) -> list:
        """One tensor per element of a tuple-valued node (read through ``getitem``); only the
        elements in ``wanted`` when given (the others are None: nothing reads them)."""
        outs = []
        for i, v in enumerate(val(node)):
            if wanted is not None and i not in wanted:
                outs.append(None)
                continue
            shape, sig = _shape_and_signature(v)
            outs.append(self.builder.add_tensor(f"{node.name}_{i}", shape, circle_type(v.dtype, self.where(node)),
                                                0, sig))
        self.values[node] = outs
        return outs

    def bind(self, node: fx.Node, index: int) -> None:
        self.values[node] = index

    def item(self, node: fx.Node, i: int) -> int:
        """Tensor of element ``i`` of a tuple-valued node lowered with :meth:`outputs`."""
        return self.values[node][i]

    # ----------------------------------------------------------- tensor info
    def annotation(self, node: fx.Node, key: str, default=None):
        """A choice a pass (or a user) left for the lowering in ``node.meta[key]``, e.g. the
        forced op form of a linear (``circle_fx.linear_form``)."""
        return node.meta.get(key, default) if isinstance(node, fx.Node) else default

    def tensor_dims(self, index: int) -> list[int]:
        """Dims (-1 dynamic) of a Circle tensor made earlier (e.g. by :meth:`outputs`)."""
        return self.builder.dims(index)

    def tensor_hint(self, index: int) -> list[int]:
        return list(self.builder.tensors[index].shape)

    def tensor_constant(self, index: int) -> np.ndarray | None:
        """The data of Circle tensor ``index`` when it is a constant (shaped as the tensor), else None."""
        t = self.builder.tensors[index]
        if not t.buffer or self.builder.buffers[t.buffer] is None:
            return None
        data = np.asarray(self.builder.buffers[t.buffer])
        want = CIRCLE_TO_NUMPY.get(t.type, data.dtype)
        return (data if data.dtype == want else data.view(want)).reshape(t.shape)

    def tensor_dtype(self, index: int) -> torch.dtype:
        return CIRCLE_TO_TORCH[self.builder.tensors[index].type]

    def inputs_with_size(self, size: torch.SymInt) -> list[tuple[fx.Node, int]]:
        """``(model input, dim)`` pairs whose size is the dynamic ``size`` (same symbolic expression)."""
        found = []
        for n in self.program.graph.nodes:
            v = n.meta.get("val") if n.op == "placeholder" else None
            if isinstance(v, torch.Tensor):
                found += [(n, d) for d, s in enumerate(v.shape)
                          if isinstance(s, torch.SymInt) and s.node.expr == size.node.expr]
        return found

    @staticmethod
    def size_bound(size: torch.SymInt) -> int | None:
        """The largest value a dynamic ``size`` can take (torch.export's range constraint:
        ``Dim(..., max=...)``), or None when unbounded."""
        upper = size.node.shape_env.bound_sympy(size.node.expr).upper
        try:
            bound = int(upper)
        except Exception:  # sympy's oo / torch's int_oo: no maximum was given
            return None
        return bound if bound < 2**31 - 1 else None

    def limit_input(self, input_name: str, dim: int, largest: int) -> None:
        """Record that the model is correct only while ``input_name``'s ``dim`` is at most
        ``largest`` (e.g. a prefix sum unrolled for that many elements); ``CircleModel.run``
        rejects larger inputs with an ``InputError``."""
        key = (input_name, dim)
        self.builder.input_limits[key] = min(largest, self.builder.input_limits.get(key, largest))

    # ------------------------------------------------------------- operators
    def op(self, code: int, inputs, outputs, options=None) -> None:
        self.builder.add_operator(code, inputs, outputs, options,
                                  source_line(self.node) if self.node is not None else "")

    def _prefix(self) -> str:
        return f"{self.node.name}/" if self.node is not None else ""


CIRCLE_TO_TORCH = {v: k for k, v in TORCH_TO_CIRCLE.items()}


def _fake(value, item):
    v = val(value) if isinstance(value, fx.Node) else value
    return v[item] if item is not None else v


def _shape_and_signature(v) -> tuple[list[int], list[int] | None]:
    """Circle's ``(shape, shape_signature)`` of a (fake) tensor: a symbolic dim becomes its
    hint and -1 respectively; the signature is None when every dim is static."""
    shape, sig, dynamic = [], [], False
    for d in v.shape:
        if isinstance(d, int):
            shape.append(d)
            sig.append(d)
        else:
            try:
                hint = int(d.node.hint) if d.node.hint is not None else 1
            except Exception:
                hint = 1
            shape.append(hint)
            sig.append(-1)
            dynamic = True
    return shape, (sig if dynamic else None)
