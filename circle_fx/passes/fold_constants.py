"""Constant folding: evaluate, at compile time, every node whose inputs are all constants.

In a ``transformers`` model this removes the position ids (``arange``), the rotary
cos/sin tables and the whole causal-mask construction (``cumsum``, ``diff``, ``index``,
``le``...), none of which need to exist on device; it also turns Gemma's ``1 + weight``
into a plain weight so the RMSNorm fusion sees an ordinary constant.

One forward sweep, O(nodes). Results that are much larger than their inputs (a broadcast
of a small constant into a huge one) are left unfolded so weights do not bloat. Ops with
several results (``broadcast_tensors`` of ``torch.distributions.Normal(0, 1)`` in Gemma3n's
activation sparsity, ``split`` of a constant) fold when only ``getitem`` reads them: each
item read becomes its own constant.
"""
from __future__ import annotations

import operator

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
    v = n.meta.get("val")
    if isinstance(v, (tuple, list)):
        if not v or not all(isinstance(x, torch.Tensor) for x in v) or not n.users or \
                any(u.target is not operator.getitem for u in n.users):
            return False
    elif not isinstance(v, torch.Tensor):
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
            if getattr(n, "_erased", False) or not _is_foldable(n):
                continue
            args = map_arg(n.args, lambda a: fetch_attr(gm, a.target))
            kwargs = map_arg(n.kwargs, lambda a: fetch_attr(gm, a.target))
            biggest = max((fetch_attr(gm, a.target).numel() for a in n.all_input_nodes), default=0)
            vals = n.meta["val"] if isinstance(n.meta["val"], (tuple, list)) else [n.meta["val"]]
            if sum(v.numel() for v in vals) > max(_GROWTH_LIMIT, biggest):
                continue
            try:
                with torch.no_grad():
                    result = n.target(*args, **kwargs)
            except Exception:
                continue  # leave it to the emitter, which reports unsupported ops properly
            if isinstance(result, torch.Tensor):
                _replace(gm, n, _constant(gm, n, result, args))
            elif isinstance(result, (tuple, list)) and all(isinstance(r, torch.Tensor) for r in result):
                for user in list(n.users):  # every user is a getitem (checked by _is_foldable)
                    _replace(gm, user, _constant(gm, user, result[user.args[1]], args))
                g.erase_node(n)
            else:
                continue
            changed = True
        return changed


def _constant(gm, n: fx.Node, result: torch.Tensor, args) -> fx.Node:
    """A ``get_attr`` holding ``result`` (never aliasing a model weight), with ``n``'s meta."""
    if result._base is not None or any(result.data_ptr() == a.data_ptr() for a in _tensors(args)):
        result = result.clone()  # never alias model weights
    name = add_constant(gm, result.contiguous(), n.name)
    with gm.graph.inserting_before(n):
        c = gm.graph.get_attr(name)
    c.meta.update(n.meta)
    c.meta["val"] = result
    return c


def _replace(gm, n: fx.Node, c: fx.Node) -> None:
    n.replace_all_uses_with(c)
    gm.graph.erase_node(n)


def _tensors(args):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(_tensors(a))
    return out
