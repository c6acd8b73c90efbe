"""The unit every pass works on: an FX ``GraphModule`` whose only placeholders are the
model's tensor inputs, with weights and other constants held as ``get_attr`` attributes.

Why not the ``ExportedProgram`` itself: lifted parameters are placeholders there, so
folding a constant (Gemma's ``1 + weight``) would mean editing the graph signature and the
state dict in step. With constants as attributes, folding is "evaluate, set attribute",
and the graph stays directly runnable in eager (``program.run``) for numerical checks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx

from .fusion_log import FusionLog
from .meta import CONST_COUNTER


@dataclass
class Program:
    gm: fx.GraphModule
    input_names: list[str]
    output_names: list[str]
    #: What capture changed to export the model (transformers implementations switched,
    #: float32 casts): one line each, printed by ``summary()`` (:mod:`circle_fx.capture`)
    implementations: list[str] = field(default_factory=list)
    #: The static quantization's notes (what stays float, and why): :mod:`circle_fx.quant.qdq`
    qdq_notes: list[str] = field(default_factory=list)
    #: The weight-only quantization's :class:`~circle_fx.quant.weight_only.QuantizationRecord`
    #: (None: no weight quantized), kept in the export report
    quantization: Any = None
    #: Run-time limits stored in the file (``circle_fx.limits`` metadata, :mod:`circle_fx.emit.index_limits`):
    #: export_llm's dynamic dims' maxima; None: none but those the emitter finds
    limits: dict | None = None
    #: Its constants are stored once with other entry points' that read them too (export_llm's
    #: one-file package): linears then keep the form that holds a weight once (:mod:`circle_fx.emit.linear_form`)
    shared_weights: bool = False
    #: The one store of applied fusions and near misses (summary, CLI, explain read it).
    fusion_log: FusionLog = field(default_factory=FusionLog)

    @property
    def graph(self) -> fx.Graph:
        return self.gm.graph

    def run(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        """Execute the (possibly rewritten) graph in eager PyTorch."""
        self.gm.recompile()
        with torch.no_grad():
            out = self.gm(*inputs)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def constant(self, node: fx.Node) -> torch.Tensor:
        """The tensor a ``get_attr`` node refers to."""
        return fetch_attr(self.gm, node.target)

    def fusions(self) -> list:
        """The fusion records (``FusionRecord``) the fuse passes kept, in the order made."""
        return self.fusion_log.fusions()


def row_chunks(t: torch.Tensor, rows: int):
    """``(start, chunk)`` pairs covering ``t`` along dim 0, each at most ``rows`` rows, as views:
    a :class:`StackedTensor` is walked part by part (slicing it would concatenate all its parts
    for every chunk: a full-size temporary per chunk, the merged gate/up weight of a 1.5B model
    is 134 MB). For the weight quantizers, which only need the rows in order. A
    :class:`~circle_fx.lazy.LazyTensor` part (a checkpoint's weight) is read here, one part at a
    time: by row slices when its source can (safetensors), else whole."""
    from .lazy import LazyTensor

    parts = t.parts if isinstance(t, StackedTensor) else [t]
    start = 0
    for p in parts:
        if isinstance(p, LazyTensor):  # a checkpoint's weight: read by row slices if it can be, else whole
            if p.rows is not None:
                for i in range(0, int(p.shape[0]), max(1, rows)):
                    yield start + i, p.rows(i, min(i + rows, int(p.shape[0])))
                start += int(p.shape[0])
                continue
            p = p.materialize()
        for i in range(0, int(p.shape[0]), max(1, rows)):
            chunk = p[i:i + rows]
            yield start + i, chunk
        start += int(p.shape[0])


def fetch_attr(gm: fx.GraphModule, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def add_constant(gm: fx.GraphModule, tensor: torch.Tensor, hint: str) -> str:
    """Register ``tensor`` on ``gm`` under a fresh attribute name derived from ``hint``."""
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in hint) or "const"
    if base[0].isdigit():
        base = "_" + base
    counter = gm.meta.setdefault(CONST_COUNTER, {})
    name = base
    while hasattr(gm, name):
        counter[base] = counter.get(base, 0) + 1
        name = f"{base}_{counter[base]}"
    gm.register_buffer(name, tensor, persistent=False)
    return name


class StackedTensor(torch.Tensor):
    """Constant tensors concatenated along dim 0, without the copy: ``parts`` are kept and
    only stacked when written (``emit`` turns this into a ``builder.Stacked`` buffer whose
    parts the writer streams one after the other).

    ``merge_linears`` stacks the q/k/v and gate/up weights of every layer; ``torch.cat`` of
    them would hold a second copy of most of a model in memory while converting. Any torch
    operation on it (an eager ``program.run``, folding, weight quantization) sees the
    concatenated tensor, made on demand (``materialize``), so the graph stays runnable.
    """

    @staticmethod
    def __new__(cls, parts):
        parts = [p.detach() for p in parts]
        shape = [sum(int(p.shape[0]) for p in parts), *parts[0].shape[1:]]
        t = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=parts[0].dtype, device=parts[0].device)
        t.parts = parts
        return t

    def __init__(self, parts):
        super().__init__()

    def materialize(self) -> torch.Tensor:
        return torch.cat(self.parts, 0)

    def __repr__(self) -> str:  # noqa: D105
        return f"StackedTensor({list(self.shape)}, {self.dtype}, {len(self.parts)} parts)"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map

        aten = torch.ops.aten
        this = args[0] if args else None
        if isinstance(this, StackedTensor):  # the forms lowerings use keep the parts apart
            if func in (aten.detach.default, aten.alias.default):
                return StackedTensor(this.parts)
            if func in (aten.view.default, aten._unsafe_view.default) and len(args) == 2:
                shape = list(args[1])
                if shape and shape[0] == this.shape[0] and -1 not in shape:  # rows kept: view each part
                    return StackedTensor([p.reshape(p.shape[0], *shape[1:]) for p in this.parts])

        def unwrap(x):
            return x.materialize() if isinstance(x, StackedTensor) else x

        return func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {}))
