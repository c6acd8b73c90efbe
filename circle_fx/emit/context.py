"""What a lowering function sees: the builder plus helpers to map FX values to tensors.

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

from ..circle.schema import QuantParams
from ..errors import UnsupportedOpError
from ..fx_utils import dtype_of, static_shape, val
from ..program import Program, fetch_attr
from ..source import op_name, source_line
from .builder import ModelBuilder
from .types import circle_type, numpy_dtype, to_numpy

#: ``node.meta`` key of a node's :class:`QuantParams` (set by quantization passes)
QUANT_META = "circle_fx.quant"


def quantization_of(node) -> QuantParams | None:
    """The quantization a pass attached to ``node`` (None: a plain tensor)."""
    return getattr(node, "meta", {}).get(QUANT_META)


class LoweringContext:
    def __init__(self, program: Program, builder: ModelBuilder):
        self.program = program
        self.builder = builder
        self.values: dict[fx.Node, int] = {}
        self.node: fx.Node | None = None  # node being lowered (for messages)

    # --------------------------------------------------------------- tensors
    def tensor(self, value, dtype: torch.dtype | None = None) -> int:
        """Tensor index for an FX node or a Python scalar (``dtype`` picks the scalar's type)."""
        if isinstance(value, fx.Node):
            if value in self.values:
                return self.values[value]
            if value.op == "get_attr":
                t = fetch_attr(self.program.gm, value.target)
                idx = self.const_tensor(t, value.target, quantization_of(value))
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

    def const_tensor(self, t: torch.Tensor, name: str, quantization: QuantParams | None = None) -> int:
        arr = to_numpy(t, f"constant {name}")
        key = None
        if t.is_contiguous() and arr.nbytes > 256:
            key = ("storage", t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype)
        buf = self.builder.add_buffer(arr, key)
        return self.builder.add_tensor(name, arr.shape, circle_type(t.dtype), buf, quantization=quantization)

    def const(self, array, name: str = "const") -> int:
        return self.builder.add_constant(f"{self._prefix()}{name}", np.asarray(array))

    def int_const(self, values, name: str = "shape") -> int:
        return self.const(np.asarray(values, dtype=np.int32), name)

    def new_tensor(self, shape, dtype: torch.dtype, name: str = "t", signature=None) -> int:
        """An intermediate tensor; ``signature`` (-1 for dynamic dims) when its shape varies."""
        return self.builder.add_tensor(f"{self._prefix()}{name}", shape, circle_type(dtype, self.where()), 0,
                                       signature)

    def like(self, node, name: str = "t", dtype: torch.dtype | None = None) -> int:
        """An intermediate tensor shaped like ``node`` (dynamic dims included)."""
        shape, sig = self.shape_of(node)
        return self.new_tensor(shape, dtype or self.dtype(node), name, sig)

    def rank(self, value) -> int:
        return len(val(value).shape)

    def is_dynamic(self, value) -> bool:
        return self.shape_of(value)[1] is not None

    def shape_operand(self, node=None, shape=None, signature=None) -> int:
        """int32 shape constant for RESHAPE to ``node``'s shape (or ``shape``/``signature``).

        A dynamic dim becomes -1, which RESHAPE infers at run time; only one dim can be
        inferred, so a shape with two dynamic dims raises a clear error.
        """
        if node is not None:
            shape, signature = self.shape_of(node)
        if signature is None:
            return self.int_const(list(shape))
        if sum(1 for d in signature if d == -1) > 1:
            raise self.error(f"reshaping to {signature} needs more than one dynamic dim (-1) inferred at run "
                             "time, which Circle's RESHAPE cannot do; mark at most one of these dims dynamic")
        return self.int_const(list(signature))

    def output(self, node: fx.Node | None = None) -> int:
        """The tensor that holds ``node``'s result (created on first use)."""
        node = node or self.node
        if node in self.values:
            return self.values[node]
        v = val(node)
        if not isinstance(v, torch.Tensor):
            raise self.error(f"%{node.name} does not produce a tensor")
        shape, sig = self.shape_of(node)
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
            shape, sig = self.shape_of_value(v)
            outs.append(self.builder.add_tensor(f"{node.name}_{i}", shape, circle_type(v.dtype, self.where(node)),
                                                0, sig))
        self.values[node] = outs
        return outs

    def bind(self, node: fx.Node, index: int) -> None:
        self.values[node] = index

    def shape_of(self, node) -> tuple[list[int], list[int] | None]:
        """``(shape, shape_signature)``: symbolic dims become their hint and -1 respectively."""
        return self.shape_of_value(val(node))

    @staticmethod
    def shape_of_value(v) -> tuple[list[int], list[int] | None]:
        """:meth:`shape_of` for a (fake) tensor, e.g. one element of a tuple-valued node."""
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

    def static_shape(self, node) -> list[int]:
        s = static_shape(node)
        if s is None:
            raise self.error(f"%{node.name} has a dynamic shape {list(val(node).shape)}, "
                             f"which {op_name(self.node.target)} cannot lower yet")
        return list(s)

    def dtype(self, value) -> torch.dtype:
        return dtype_of(value)

    # ------------------------------------------------------------- operators
    def op(self, code: int, inputs, outputs, options=None) -> None:
        self.builder.add_operator(code, inputs, outputs, options,
                                  source_line(self.node) if self.node is not None else "")

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

    def _prefix(self) -> str:
        return f"{self.node.name}/" if self.node is not None else ""
