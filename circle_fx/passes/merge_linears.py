"""Horizontal fusion: sibling linears that read the same input become one linear + split.

Attention's q/k/v projections and the MLP's gate/up projections all multiply the same
activation. One ``[rows, in] x [in, out_q + out_k + out_v]`` product instead of three
reads the activation once and gives the runtime one larger GEMM (measured in
``docs/onert-findings.md``, "Linear forms"). The ``[rows, out]`` product (FULLY_CONNECTED's own
output; static shapes) is split back along the last dim with ``aten.split_with_sizes``, which the emitter lowers to SPLIT (equal pieces) or one
SLICE per piece — never SPLIT_V, which onert 0.1.0 computes as zeros.

A group is merged when every member is ``aten.linear(x, W_i[, b_i])`` on the *same* node
``x`` with constant weights of one dtype, and either no member has a bias or all have
constant ones. The merge happens on the weight constants at FX level (``torch.cat`` along
the output dim, at compile time), before the emitter chooses the op form or quantizes:

- per-output-channel quantization (one scale per row of ``W``) computed later on the merged
  weight gives exactly the concatenation of the members' per-channel scales, so the int8
  path sees the same numbers as without merging;
- when a quantization pass ran first and attached :class:`QuantParams` to the weights
  (``node.meta[QUANT_META]``), per-output-channel parameters (axis 0) are concatenated
  in member order, which is exactly what the merged weight's rows need; per-tensor
  parameters merge only when equal (a shared scale); anything else is left unmerged;
- any other metadata on the weights or linears (markers of other passes in ``node.meta``)
  must be equal across a group, and is carried over to the merged nodes; members with
  different markers are left alone.

The merged weight is a :class:`~circle_fx.program.StackedTensor`: the members' weights are
kept as they are and only stacked when the file is written (no copy of the weights in memory).

Turn it off with ``pipeline.remove_pass("merge_linears")``. O(nodes + merged bias bytes).
"""
from __future__ import annotations

import math
import operator

import torch
import torch.fx as fx

from ..circle.schema import QuantParams
from ..meta import CONSTANT_NAMES, QUANT_META
from ..fx_utils import arguments, dtype_of, fake_constant, make_node, static_shape
from ..program import StackedTensor, add_constant, fetch_attr
from ..pass_protocol import Pass

aten = torch.ops.aten

#: meta keys torch.export and FX own; every other key is treated as a user/pass marker
_FX_META = frozenset({"val", "tensor_meta", "stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn",
                      "from_node", "seq_nr", "original_aten", "example_value", "unbacked_bindings",
                      "is_torch_fn", "partitioner_tag", "custom", "autograd_backward_hook",
                      "source_node", "grapharg"})


def markers(node: fx.Node) -> dict:
    """The metadata of ``node`` that is not FX's own (for example quantization markers)."""
    return {k: v for k, v in node.meta.items() if k not in _FX_META}


def _marker_key(node: fx.Node) -> str:
    """What must agree across a group: every marker, and of the quantization only its kind
    (per-channel parameters differ per member and are concatenated)."""
    items = dict(markers(node))
    q = items.pop(QUANT_META, None)
    if q is not None:
        items[QUANT_META] = ("per-channel", q.axis) if q.per_channel else q
    return repr(sorted(items.items(), key=lambda kv: kv[0]))


def _merged_quant(weight_nodes: list) -> QuantParams | None:
    """The merged weight's quantization: per-channel (axis 0) concatenated, per-tensor shared."""
    qs = [n.meta.get(QUANT_META) for n in weight_nodes]
    if qs[0] is None:
        return None
    if not qs[0].per_channel:
        return qs[0]
    return QuantParams(tuple(x for q in qs for x in q.scale), tuple(z for q in qs for z in q.zero_point), axis=0)


def _mergeable_quant(weight_nodes: list) -> bool:
    qs = [n.meta.get(QUANT_META) for n in weight_nodes]
    if all(q is None for q in qs):
        return True
    if any(q is None for q in qs):
        return False
    if all(q.per_channel and q.axis == 0 for q in qs):
        return all(len(q.scale) == int(n.meta["val"].shape[0]) for q, n in zip(qs, weight_nodes))
    return all(not q.per_channel and q == qs[0] for q in qs)


def _candidate(n: fx.Node):
    """``(x, weight, bias)`` when ``n`` is a linear this pass may merge, else None."""
    if n.op != "call_function" or n.target is not aten.linear.default:
        return None
    x, w, b = (arguments(n) + [None])[:3]
    if not isinstance(x, fx.Node) or not isinstance(w, fx.Node) or w.op != "get_attr":
        return None
    if b is not None and (not isinstance(b, fx.Node) or b.op != "get_attr"):
        return None
    v = w.meta.get("val")
    if v is None or len(v.shape) != 2:
        return None
    return x, w, b


class MergeLinears(Pass):
    name = "merge_linears"

    def run(self, program) -> bool:
        gm = program.gm
        groups: dict[tuple, list] = {}
        for n in gm.graph.nodes:
            c = _candidate(n)
            if c is None:
                continue
            x, w, b = c
            key = (x, dtype_of(w), b is None, b is not None and dtype_of(b), _marker_key(w),
                   _marker_key(b) if b is not None else "", _marker_key(n))
            groups.setdefault(key, []).append((n, w, b))
        changed = False
        for members in groups.values():
            if len(members) >= 2 and _mergeable_quant([w for _, w, _ in members]) and (
                    members[0][2] is None or _mergeable_quant([b for _, _, b in members])):
                self._merge(gm, members)
                changed = True
        return changed

    @staticmethod
    def _merge(gm: fx.GraphModule, members: list) -> None:
        g = gm.graph
        first, w0, b0 = members[0]
        x = first.args[0]
        weights = [fetch_attr(gm, w.target).detach() for _, w, _ in members]
        sizes = [int(t.shape[0]) for t in weights]
        hint = "_".join(w.target.replace(".", "_") for _, w, _ in members[:1]) + f"_merged{len(members)}"
        with g.inserting_before(first):
            # stacked lazily: the writer streams the parts, no second copy of the weights in memory
            w_node = _constant(g, gm, StackedTensor(weights), hint, [w for _, w, _ in members])
            args = (x, w_node)
            if b0 is not None:
                biases = [fetch_attr(gm, b.target).detach() for _, _, b in members]
                args += (_constant(g, gm, torch.cat(biases, 0), hint + "_bias", [b for _, _, b in members]),)
            merged = make_node(g, aten.linear.default, args, like=first)
            merged.meta.update(markers(first))
            shape = static_shape(merged)
            flat = len(shape) > 2 if shape is not None else False
            if flat:  # split the [rows, out] product the runtime computes, not its N-D view
                merged = make_node(g, aten.reshape.default, (merged, [math.prod(shape[:-1]), shape[-1]]),
                                   like=first)
            split = make_node(g, aten.split_with_sizes.default, (merged, sizes, -1), like=first)
            pieces = [make_node(g, operator.getitem, (split, i), like=n) for i, (n, _, _) in enumerate(members)]
            if flat:
                pieces = [make_node(g, aten.reshape.default, (p, list(static_shape(n))), like=n)
                          for p, (n, _, _) in zip(pieces, members)]
        for (n, _, _), piece in zip(members, pieces):
            n.replace_all_uses_with(piece)
            g.erase_node(n)


def _constant(g: fx.Graph, gm: fx.GraphModule, tensor: torch.Tensor, hint: str, parts: list) -> fx.Node:
    """The stacked constant, carrying the members' markers and their merged quantization."""
    if not isinstance(tensor, StackedTensor):
        tensor = tensor.contiguous()
    node = g.get_attr(add_constant(gm, tensor, hint))
    names = gm.meta.setdefault(CONSTANT_NAMES, {})  # provenance, for messages and skip lists
    names[node.target] = "+".join(names.get(p.target, p.target) for p in parts)
    node.meta.update({k: v for k, v in markers(parts[0]).items() if k != QUANT_META})
    quant = _merged_quant(parts)
    if quant is not None:
        node.meta[QUANT_META] = quant
    node.meta["val"] = fake_constant(g, tensor)  # static dims, like the captured weights'
    return node
