"""Fold chains of reshapes and of transposes into one op, or none.

Every view-like op (``view``, ``reshape``, ``_unsafe_view``, ``squeeze``, ``unsqueeze``,
``flatten``, ``unflatten``) becomes one Circle RESHAPE to its output shape, so what it
reads matters only through its element order, which a reshape never changes:

- ``reshape(reshape(x))`` -> ``reshape(x)``: the outer one reads ``x`` directly (the inner
  one dies if nothing else reads it); this also covers squeeze/unsqueeze pairs;
- a reshape to its input's own shape -> nothing;
- ``permute(permute(x))`` -> one ``permute`` with the composed order, or nothing when the
  composition is the identity (``transpose`` and ``t`` are permutes too);
- ``reshape(expand(unsqueeze(x, d)))`` that repeats each slice of dim ``d - 1`` ``r`` times
  (transformers' ``repeat_kv`` for grouped-query attention: RESHAPE, BROADCAST_TO, RESHAPE)
  -> one ``index_select(x, d - 1, [0,..,0, 1,..,1, ...])``, a single GATHER (static shapes).

One forward sweep, so whole chains collapse; O(nodes). Exact: no value changes, only how
many times the runtime moves it. Dynamic shapes: a reshape whose target shape is symbolic
keeps its own shape argument (``view``/``reshape`` only), and shapes are compared
symbol by symbol.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..fx_utils import fake_constant, make_node, shape_of, static_shape
from ..op_traits import MOVEMENT, PERMUTE, RESHAPE, VIEW
from ..program import add_constant
from .base import NodePass

aten = torch.ops.aten



def _is(n, ops) -> bool:
    return isinstance(n, fx.Node) and n.op == "call_function" and n.target in ops


def _same_shape(a, b) -> bool:
    sa, sb = shape_of(a), shape_of(b)
    return sa is not None and sb is not None and [str(d) for d in sa] == [str(d) for d in sb]


def permutation(n: fx.Node) -> list[int]:
    """The permutation a permute/transpose/t node applies (output dim i = input dim perm[i])."""
    rank = len(shape_of(n.args[0]))
    if n.target is aten.permute.default:
        return [d % rank for d in n.args[1]]
    perm = list(range(rank))
    if n.target is aten.t.default:
        return perm[::-1]
    a, b = n.args[1] % rank, n.args[2] % rank
    perm[a], perm[b] = perm[b], perm[a]
    return perm


class FoldViews(NodePass):
    name = "fold_views"

    def visit(self, program, n) -> bool:
        g = program.gm.graph
        if _is(n, VIEW):
            new = self._fold_reshape(g, n) or self._repeat_interleave(program, g, n)
        elif _is(n, PERMUTE):
            new = self._fold_permute(g, n)
        else:
            return False
        if new is None:
            return False
        n.replace_all_uses_with(new)
        g.erase_node(n)
        src = n.args[0]
        while _is(src, MOVEMENT) and not src.users:
            nxt = src.args[0]
            g.erase_node(src)  # the inner ops of a chain, read by nobody else now
            src = nxt
        return True

    @staticmethod
    def _repeat_interleave(program, g: fx.Graph, n: fx.Node):
        e = n.args[0]
        if not (_is(e, {aten.expand.default}) and len(e.users) == 1 and _is(e.args[0], VIEW)):
            return None
        u = e.args[0]
        x = u.args[0]
        xs, us, es, ns = (static_shape(v) for v in (x, u, e, n))
        if None in (xs, us, es, ns) or len(us) != len(xs) + 1:
            return None
        d = next((k for k in range(len(us)) if list(us[:k]) + list(us[k + 1:]) == list(xs) and us[k] == 1), None)
        if not d:  # no unit dim inserted, or at 0 (nothing to interleave with)
            return None
        r = es[d]
        if list(es[:d]) + list(es[d + 1:]) != list(xs) or list(ns) != list(xs[:d - 1]) + [xs[d - 1] * r] + list(xs[d:]):
            return None
        index = torch.arange(xs[d - 1]).repeat_interleave(r)
        with g.inserting_before(n):
            idx = g.get_attr(add_constant(program.gm, index, f"{n.name}_repeat_index"))
            idx.meta["val"] = fake_constant(g, index)
            return make_node(g, aten.index_select.default, (x, d - 1, idx), like=n)

    @staticmethod
    def _fold_reshape(g: fx.Graph, n: fx.Node):
        src = n.args[0]
        while _is(src, VIEW):
            src = src.args[0]
        if _same_shape(src, n):
            return src
        if src is n.args[0]:
            return None
        if n.target in RESHAPE:
            shape = n.args[1]
        else:
            shape = static_shape(n)
            if shape is None:
                return None
            shape = list(shape)
        with g.inserting_before(n):
            return make_node(g, aten.reshape.default, (src, shape), like=n)

    @staticmethod
    def _fold_permute(g: fx.Graph, n: fx.Node):
        perm = permutation(n)
        src = n.args[0]
        while _is(src, PERMUTE):
            inner = permutation(src)
            perm = [inner[p] for p in perm]
            src = src.args[0]
        if perm == list(range(len(perm))):
            return src
        if src is n.args[0]:
            return None
        with g.inserting_before(n):
            return make_node(g, aten.permute.default, (src, perm), like=n)
