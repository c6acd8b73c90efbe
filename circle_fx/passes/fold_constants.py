"""Constant folding: evaluate, at compile time, every node whose inputs are all constants.

In a ``transformers`` model this removes the position ids (``arange``), the rotary
cos/sin tables and the whole causal-mask construction (``cumsum``, ``diff``, ``index``,
``le``...), none of which need to exist on device; it also turns Gemma's ``1 + weight``
into a plain weight so the RMSNorm fusion sees an ordinary constant.

One forward sweep, O(nodes). Results that are much larger than their inputs (a broadcast
of a small constant into a huge one) are left unfolded so weights do not bloat.
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.node import map_arg

from ..program import add_constant, fetch_attr
from .base import Pass

#: results above this many elements must not be larger than their largest input
_GROWTH_LIMIT = 1 << 20


def _is_foldable(n: fx.Node) -> bool:
    if n.op != "call_function":
        return False
    target = n.target
    tags = getattr(target, "tags", ())
    if torch.Tag.nondeterministic_seeded in tags:
        return False
    schema = getattr(target, "_schema", None)
    if schema is not None and (schema.is_mutable or any(a.alias_info and a.alias_info.is_write for a in schema.arguments)):
        return False
    if not isinstance(n.meta.get("val"), torch.Tensor):
        return False
    inputs = n.all_input_nodes
    return all(i.op == "get_attr" for i in inputs)


class FoldConstants(Pass):
    name = "fold_constants"

    def run(self, program) -> bool:
        gm = program.gm
        g = gm.graph
        changed = False
        for n in list(g.nodes):
            if not _is_foldable(n):
                continue
            args = map_arg(n.args, lambda a: fetch_attr(gm, a.target))
            kwargs = map_arg(n.kwargs, lambda a: fetch_attr(gm, a.target))
            biggest = max((fetch_attr(gm, a.target).numel() for a in n.all_input_nodes), default=0)
            if n.meta["val"].numel() > max(_GROWTH_LIMIT, biggest):
                continue
            try:
                with torch.no_grad():
                    result = n.target(*args, **kwargs)
            except Exception:
                continue  # leave it to the emitter, which reports unsupported ops properly
            if not isinstance(result, torch.Tensor):
                continue
            if result._base is not None or any(result.data_ptr() == a.data_ptr() for a in _tensors(args)):
                result = result.clone()  # never alias model weights
            name = add_constant(gm, result.contiguous(), n.name)
            with g.inserting_before(n):
                c = g.get_attr(name)
            c.meta.update(n.meta)
            c.meta["val"] = result
            n.replace_all_uses_with(c)
            g.erase_node(n)
            changed = True
        return changed


def _tensors(args):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(_tensors(a))
    return out
