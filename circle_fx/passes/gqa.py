"""Grouped-query attention: ``sdpa(q, repeat_kv(k), repeat_kv(v))`` -> ``sdpa(q, k, v, enable_gqa=True)``.

transformers repeats the K/V heads before SDPA whenever it passes a mask
(``unsqueeze(2) -> expand -> reshape``), which Circle can only spell as BROADCAST_TO: a full
copy of K and V per layer and call. In a KV-cache decode step that copy is of the whole
cache (measured: a quarter of the 125M Llama's decode time in onert). With
``enable_gqa=True`` the SDPA lowering multiplies each K/V head with its group of query
heads directly (grouped BATCH_MATMUL, see ``emit/lowerings/attention.py``), same math,
no copy. ``export_llm`` runs this pass; the default pipeline does not (yet).
"""
from __future__ import annotations

import torch

from ..fx_utils import arguments, erase_unused, look_through, make_node, shape_of
from ..op_traits import RESHAPE
from ..pass_protocol import Pass

aten = torch.ops.aten


def _unrepeated(node, heads):
    """``x`` if ``node`` is HF's ``repeat_kv(x, heads // x.heads)`` (4-D, static), else None."""
    if not (node.op == "call_function" and node.target in RESHAPE):
        return None, []
    exp = look_through(node.args[0])
    if not (exp.op == "call_function" and exp.target is aten.expand.default):
        return None, []
    uns = look_through(exp.args[0])
    if not (uns.op == "call_function" and uns.target is aten.unsqueeze.default and uns.args[1] == 2):
        return None, []
    x = uns.args[0]
    xs, es, rs = shape_of(x), shape_of(exp), shape_of(node)
    if any(s is None or any(not isinstance(d, int) for d in s) for s in (xs, es, rs)) or len(xs) != 4:
        return None, []
    b, hk, s, d = xs
    if heads % hk or list(es) != [b, hk, heads // hk, s, d] or list(rs) != [b, heads, s, d]:
        return None, []
    return x, [node, exp, uns]


class GroupedQueryAttention(Pass):
    name = "grouped_query_attention"

    def run(self, program) -> bool:
        g = program.graph
        changed = False
        for node in list(g.nodes):
            if node.op != "call_function" or node.target is not aten.scaled_dot_product_attention.default:
                continue
            q, k, v, mask, dropout, causal, scale, gqa = arguments(node)
            qs = shape_of(q)
            if qs is None or len(qs) != 4 or not isinstance(qs[1], int):
                continue
            k0, k_nodes = _unrepeated(k, qs[1])
            v0, v_nodes = _unrepeated(v, qs[1])
            if k0 is None or v0 is None or shape_of(k0)[1] != shape_of(v0)[1]:
                continue
            with g.inserting_before(node):
                new = make_node(g, aten.scaled_dot_product_attention.default, (q, k0, v0, mask, dropout, causal),
                                {"scale": scale, "enable_gqa": True}, like=node)
            node.replace_all_uses_with(new)
            g.erase_node(node)
            erase_unused(g, k_nodes + v_nodes)
            changed = True
        return changed
