"""Fold chains of reshapes and of transposes into one op, or none.

Every view-like op (``view``, ``reshape``, ``_unsafe_view``, ``squeeze``, ``unsqueeze``,
``flatten``, ``unflatten``) becomes one Circle RESHAPE to its output shape, so what it
reads matters only through its element order, which a reshape never changes:

- ``reshape(reshape(x))`` -> ``reshape(x)``: the outer one reads ``x`` directly (the inner
  one dies, in the DCE after this pass, if nothing else reads it); this also covers squeeze/unsqueeze pairs;
- a reshape to its input's own shape -> nothing;
- ``permute(permute(x))`` -> one ``permute`` with the composed order, or nothing when the
  composition is the identity (``transpose`` and ``t`` are permutes too);
- ``reshape(expand(unsqueeze(x, d)))`` that repeats each slice of dim ``d - 1`` ``r`` times
  (transformers' ``repeat_kv`` for grouped-query attention: RESHAPE, BROADCAST_TO, RESHAPE)
  -> one ``index_select(x, d - 1, [0,..,0, 1,..,1, ...])``, a single GATHER (static shapes).

Each is a pattern rule (:data:`RULES`: the op with its arguments as wildcards, named checks,
a replacement); the first check of a rule says whether the node is its form at all, a later
one that refuses is a near miss ``explain`` reports (a squeeze chain with a symbolic target,
an expand of a unit dim that is not a repeat of each slice).

One forward sweep, so whole chains collapse; O(nodes). Exact: no value changes, only how
many times the runtime moves it. Dynamic shapes: a reshape whose target shape is symbolic
keeps its own shape argument (``view``/``reshape`` only), and shapes are compared
symbol by symbol.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..fx_utils import fake_constant, make_node, shape_of, static_shape
from ..op_traits import PERMUTE, RESHAPE, VIEW
from ..patterns import Match, Rewrite, RewriteRules, op_pattern
from ..program import add_constant

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


# ------------------------------------------------------------------ reshape chains

def _view_source(n: fx.Node) -> fx.Node:
    src = n.args[0]
    while _is(src, VIEW):
        src = src.args[0]
    return src


def reshape_of_a_view(m: Match) -> str | None:
    """The rule's form: a view op reading a view op, or reshaping to its input's own shape."""
    n = m.root
    src = _view_source(n)
    return None if _same_shape(src, n) or src is not n.args[0] else "reads no view op"


def static_target_shape(m: Match) -> str | None:
    """The folded reshape needs the target shape: a view/reshape names it (symbols allowed);
    for squeeze/unsqueeze/flatten it must be static."""
    n = m.root
    if _same_shape(_view_source(n), n) or n.target in RESHAPE or static_shape(n) is not None:
        return None
    return f"{n.target.__name__}'s output shape {[str(d) for d in shape_of(n)]} is symbolic"


def fold_reshape(m: Match, g: fx.Graph) -> fx.Node:
    n = m.root
    src = _view_source(n)
    if _same_shape(src, n):
        return src
    shape = n.args[1] if n.target in RESHAPE else list(static_shape(n))
    return make_node(g, aten.reshape.default, (src, shape), like=n)


# ------------------------------------------------------------------ repeat_kv

def _repeat_parts(n: fx.Node):
    """``(x, unsqueeze, expand)`` of ``reshape(expand(view(x)))``, or None."""
    e = n.args[0]
    if not (_is(e, {aten.expand.default}) and len(e.users) == 1 and _is(e.args[0], VIEW)):
        return None
    return e.args[0].args[0], e.args[0], e


def _unit_dim(xs, us) -> int | None:
    """The dim the view inserted (a size-1 dim, the rest ``xs``), or None."""
    if len(us) != len(xs) + 1:
        return None
    return next((k for k in range(len(us)) if list(us[:k]) + list(us[k + 1:]) == list(xs) and us[k] == 1), None)


def reshape_of_an_expanded_unit_dim(m: Match) -> str | None:
    """The rule's form: ``reshape(expand(view(x)))`` (the expand read by nothing else), static
    shapes, the view inserting one unit dim after dim 0."""
    parts = _repeat_parts(m.root)
    if parts is None:
        return "reads no expanded view"
    shapes = [static_shape(v) for v in (*parts, m.root)]
    if None in shapes:
        return "symbolic shapes"
    d = _unit_dim(shapes[0], shapes[1])
    return None if d else "the view inserts no unit dim after dim 0"


def repeats_each_slice(m: Match) -> str | None:
    """The expand repeats only the inserted dim, and the reshape merges it into the dim before."""
    x, u, e = _repeat_parts(m.root)
    xs, us, es, ns = (static_shape(v) for v in (x, u, e, m.root))
    d = _unit_dim(xs, us)
    r = es[d]
    if list(es[:d]) + list(es[d + 1:]) != list(xs):
        return f"the expand to {list(es)} repeats more than the inserted dim {d}"
    if list(ns) != list(xs[:d - 1]) + [xs[d - 1] * r] + list(xs[d:]):
        return f"the reshape to {list(ns)} does not merge the {r} repeats into dim {d - 1}"
    return None


def repeat_interleave(m: Match, g: fx.Graph) -> fx.Node:
    n = m.root
    x, u, e = _repeat_parts(n)
    xs, us, es = (static_shape(v) for v in (x, u, e))
    d = _unit_dim(xs, us)
    index = torch.arange(xs[d - 1]).repeat_interleave(es[d])
    idx = g.get_attr(add_constant(g.owning_module, index, f"{n.name}_repeat_index"))
    idx.meta["val"] = fake_constant(g, index)
    return make_node(g, aten.index_select.default, (x, d - 1, idx), like=n)


# ------------------------------------------------------------------ permute chains

def _composed(n: fx.Node) -> tuple[list[int], fx.Node]:
    perm = permutation(n)
    src = n.args[0]
    while _is(src, PERMUTE):
        inner = permutation(src)
        perm = [inner[p] for p in perm]
        src = src.args[0]
    return perm, src


def permute_of_a_permute(m: Match) -> str | None:
    """The rule's form (its only check): a permute reading a permute, or the identity."""
    perm, src = _composed(m.root)
    return None if perm == list(range(len(perm))) or src is not m.root.args[0] else "reads no permute"


def fold_permute(m: Match, g: fx.Graph) -> fx.Node:
    perm, src = _composed(m.root)
    if perm == list(range(len(perm))):
        return src
    return make_node(g, aten.permute.default, (src, perm), like=m.root)


def _rules() -> list[Rewrite]:
    rules = []
    for t in sorted(VIEW, key=str):  # the reshape fold first, as each view op tries it first
        rules.append(Rewrite("fold_reshape_chain", op_pattern(t, "fold_reshape_chain"), fold_reshape,
                             (reshape_of_a_view, static_target_shape), "one reshape"))
    for t in sorted(VIEW, key=str):
        rules.append(Rewrite("repeat_interleave", op_pattern(t, "repeat_interleave"), repeat_interleave,
                             (reshape_of_an_expanded_unit_dim, repeats_each_slice), "one GATHER"))
    for t in sorted(PERMUTE, key=str):
        rules.append(Rewrite("fold_permute_chain", op_pattern(t, "fold_permute_chain"), fold_permute,
                             (permute_of_a_permute,), "one permute"))
    return rules


RULES = _rules()


class FoldViews(RewriteRules):
    """The ``fold_views`` pass: :data:`RULES` in one sweep. The inner ops of a folded chain
    that nobody else reads are left to the DCE after it."""

    def __init__(self, record_failures: bool = False) -> None:
        super().__init__(RULES, name="fold_views", record_failures=record_failures)
