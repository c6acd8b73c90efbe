"""The unit every pass works on: an FX ``GraphModule`` whose only placeholders are the
model's tensor inputs, with weights and other constants held as ``get_attr`` attributes.

Why not the ``ExportedProgram`` itself: lifted parameters are placeholders there, so
folding a constant (Gemma's ``1 + weight``) would mean editing the graph signature and the
state dict in step. With constants as attributes, folding is "evaluate, set attribute",
and the graph stays directly runnable in eager (``program.run``) for numerical checks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx as fx

from .fusion_log import FusionLog


@dataclass
class Program:
    gm: fx.GraphModule
    input_names: list[str]
    output_names: list[str]
    #: Free-form records passes may keep (not read by circle_fx itself).
    notes: dict = field(default_factory=dict)
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
    counter = gm.meta.setdefault("circle_fx.const_counter", {})
    name = base
    while hasattr(gm, name):
        counter[base] = counter.get(base, 0) + 1
        name = f"{base}_{counter[base]}"
    gm.register_buffer(name, tensor, persistent=False)
    return name
