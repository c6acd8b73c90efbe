"""Constant folding: evaluate, at compile time, every node whose inputs are all constants.

In a ``transformers`` model this removes the position ids (``arange``), the rotary
cos/sin tables and the whole causal-mask construction (``cumsum``, ``diff``, ``index``,
``le``...), none of which need to exist on device; it also turns Gemma's ``1 + weight``
into a plain weight so the RMSNorm fusion sees an ordinary constant.

Ops with several results (``unbind``, ``split``, ``chunk`` of a weight: DeepSeek-V4's
``self.scale.unbind(0)``) fold too when every use is a ``getitem``: each read result
becomes its own constant.

A folded constant computed from exactly one named parameter of its size (a reshaped,
transposed or BatchNorm-rescaled weight) keeps that parameter's name in ``CONSTANT_NAMES``,
so weight quantization's skip patterns and ``summary()`` still name it.

One forward sweep, O(nodes). Results that are much larger than their inputs (a broadcast
of a small constant into a huge one) are left unfolded so weights do not bloat.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch.fx.node import map_arg

from ..op_traits import IDENTITY, MOVEMENT
from ..meta import CONSTANT_NAMES, DEQUANTIZED_FROM
from ..program import add_constant, fetch_attr
from ..pass_protocol import Pass

#: results above this many elements must not be larger than their largest input
_GROWTH_LIMIT = 1 << 20


def _is_tuple_of_tensors(n: fx.Node) -> bool:
    """A multi-result op whose results are only read through ``getitem``."""
    v = n.meta.get("val")
    return (isinstance(v, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in v)
            and bool(n.users) and all(u.target is operator.getitem for u in n.users))


def _randomness_off(n: fx.Node) -> bool:
    """A seeded op whose randomness is switched off by its arguments: attention or dropout with
    probability 0 (every exported inference graph's ``scaled_dot_product_attention``; DETR's first
    decoder self-attention reads only constants: zero queries and learned query positions)."""
    schema = getattr(n.target, "_schema", None)
    if schema is None:
        return False
    args = {a.name: a.default_value if a.has_default_value() else None for a in schema.arguments}
    args.update(zip((a.name for a in schema.arguments), n.args))
    args.update(n.kwargs)
    if "dropout_p" in args:
        return args["dropout_p"] == 0
    if "train" in args and "p" in args:
        return args["train"] is False or args["p"] == 0
    return False


def _is_foldable(n: fx.Node) -> bool:
    if n.op != "call_function":
        return False
    target = n.target
    tags = getattr(target, "tags", ())
    if torch.Tag.nondeterministic_seeded in tags and not _randomness_off(n):
        return False
    schema = getattr(target, "_schema", None)
    if schema is not None and (schema.is_mutable or any(a.alias_info and a.alias_info.is_write for a in schema.arguments)):
        return False
    v = n.meta.get("val")
    if not isinstance(v, torch.Tensor) and not _is_tuple_of_tensors(n):
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
            v = n.meta["val"]
            if sum(t.numel() for t in (v if isinstance(v, (tuple, list)) else [v])) > max(_GROWTH_LIMIT, biggest):
                continue
            try:
                with torch.no_grad():
                    result = n.target(*args, **kwargs)
            except Exception:
                continue  # leave it to the emitter, which reports unsupported ops properly
            if isinstance(result, torch.Tensor):
                n.replace_all_uses_with(_constant(gm, n, result, args, n.name))
            elif isinstance(result, (tuple, list)) and isinstance(v, (tuple, list)) and len(result) == len(v):
                for user in list(n.users):
                    i = user.args[1]
                    user.replace_all_uses_with(_constant(gm, user, result[i], args, user.name))
                    g.erase_node(user)
            else:
                continue
            g.erase_node(n)
            changed = True
        return changed


def _constant(gm, n: fx.Node, result: torch.Tensor, args, name: str) -> fx.Node:
    """A ``get_attr`` holding ``result``, inserted before ``n`` and carrying its meta."""
    if result._base is not None or any(result.data_ptr() == a.data_ptr() for a in _tensors(args)):
        result = result.clone()  # never alias model weights
    name = add_constant(gm, result.contiguous(), name)
    names = gm.meta.get(CONSTANT_NAMES)
    if names:
        sources = {names[a.target] for a in n.all_input_nodes if a.op == "get_attr" and a.target in names
                   and fetch_attr(gm, a.target).numel() == result.numel()}
        if len(sources) == 1:
            names[name] = sources.pop()
    with gm.graph.inserting_before(n):
        c = gm.graph.get_attr(name)
    c.meta.update(n.meta)
    c.meta["val"] = result
    tag = _moved_dequantized(n)
    if tag is not None:
        c.meta[DEQUANTIZED_FROM] = tag
    return c


def _moved_dequantized(n: fx.Node):
    """The ``DEQUANTIZED_FROM`` record of a dequantized weight (quantized per tensor) that ``n``
    only reshapes or moves (a 1-D convolution's weight gets a unit dim): its result holds the
    same integers' values, with the same scale."""
    src = n.args[0] if n.args else None
    if n.target not in MOVEMENT | IDENTITY or not isinstance(src, fx.Node):
        return None
    tag = src.meta.get(DEQUANTIZED_FROM)
    return tag if tag is not None and not tag[0].per_channel else None


def _tensors(args):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(_tensors(a))
    return out
