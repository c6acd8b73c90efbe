"""The layout pass's axis rules: ops that read or change axes commute with a permute once their
axes are mapped through it.

``op(permute(x, p), axes)`` computes the same values as ``permute'(op(x, p[axes]))``, where
``permute'`` is ``p`` with the dims the op removed or added accounted for; so the layout pass
(:mod:`circle_fx.layout.propagate`) moves a layout permute past

- reductions (``mean/sum/amax/amin`` over any axes, with or without ``keepdim``): a
  squeeze-excite ``x.mean((2, 3), keepdim=True)`` on an NHWC map becomes a MEAN over H and W;
- axis ops (softmax / log-softmax / cumsum over one axis (a softmax only when it is not
  moved off the last axis, the only one Circle's SOFTMAX runs on), ``cat`` of permutes by the same
  order, ``split``/``chunk``, ``slice``, ``select``, ``index_select``, a one-index ``index``: bilinear upsampling's
  GATHERs), the axis remapped;
- reshapes (``view``/``reshape``/``flatten``/``unflatten``/``squeeze``/``unsqueeze``) that split
  dims or merge dims lying next to each other in ``x`` too (``flatten(2).transpose(1, 2)`` of
  a vision transformer's patch embedding; GroupNorm's ``[N, G, C/G, H*W]`` view): the reshape
  is done on ``x`` and the permute follows, over the reshaped dims.

Each rule returns the new ``(inner op, output permutation)``; the output permute (none when the
order is the identity) is marked as a layout permute so later rules move it on. Exact: values
are only moved. Static shapes only for reshapes (the dims are matched by size).
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..fx_utils import erase_unused, infer_val, make_node, static_shape
from ..op_traits import ALONG_AXIS, AXIS_SIZED, FULL_REDUCTION, REDUCTION, SOFTMAX, SPLIT, VIEW

aten = torch.ops.aten



def _kept_order(perm: list[int], removed: set[int]) -> list[int]:
    """The order of the output dims after the permuted dims in ``removed`` (output positions)
    are dropped, as positions among the source dims that stay."""
    kept_src = sorted(perm[i] for i in range(len(perm)) if i not in removed)
    return [kept_src.index(perm[i]) for i in range(len(perm)) if i not in removed]


def reduction(n: fx.Node, x: fx.Node, perm: list[int]):
    rank = len(perm)
    if n.target in FULL_REDUCTION and (len(n.args) < 2 or not n.args[1]):
        return (n.target, (x, *n.args[1:])), None  # every axis: the result (all ones with keepdim) has no order
    dims = n.args[1]
    if dims is None or isinstance(dims, int):
        dims = [dims] if isinstance(dims, int) else list(range(rank))
    dims = sorted({d % rank for d in dims})
    keepdim = bool(n.args[2]) if len(n.args) > 2 else bool(n.kwargs.get("keepdim", False))
    inner = (n.target, (x, sorted(perm[d] for d in dims), *n.args[2:]))
    return inner, (perm if keepdim else _kept_order(perm, set(dims)))


def along_axis(n: fx.Node, x: fx.Node, perm: list[int]):
    if len(n.args) < 2:
        return None
    dim = n.args[1] % len(perm)
    last = len(perm) - 1
    if n.target in SOFTMAX and dim == last and perm[dim] != last:
        return None  # Circle's (LOG_)SOFTMAX runs on the last axis: moved, it would need two TRANSPOSEs
    return (n.target, (x, perm[dim], *n.args[2:])), perm


def select(n: fx.Node, x: fx.Node, perm: list[int]):
    dim = n.args[1] % len(perm)
    return (n.target, (x, perm[dim], *n.args[2:])), _kept_order(perm, {dim})


def index_one(n: fx.Node, x: fx.Node, perm: list[int]):
    """``x[..., idx, ...]`` with one index tensor: its dims take the indexed dim's place."""
    indices = list(n.args[1])
    used = [i for i, v in enumerate(indices) if v is not None]
    if len(used) != 1:
        return None
    d = used[0]
    idx = indices[d]
    k = len(idx.meta["val"].shape) if isinstance(idx, fx.Node) and "val" in idx.meta else None
    if k is None or idx.meta["val"].dtype == torch.bool:
        return None
    src = perm[d]
    new_indices = [None] * src + [idx]

    def place(s):  # a source dim's position in the result
        return s if s < src else s + k - 1
    out = [place(s) for s in perm[:d]] + list(range(src, src + k)) + [place(s) for s in perm[d + 1:]]
    return (n.target, (x, new_indices)), out


def _groups(src: list[int], dst: list[int]):
    """Pair runs of ``src`` and ``dst`` dims (sizes > 1 only) with equal products; each pair has
    one dim on at least one side (a split or a merge), else None."""
    out, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        if i == len(src) or j == len(dst):
            return None
        a, b = [i], [j]
        pa, pb = src[i], dst[j]
        while pa != pb:
            if pa < pb:
                i += 1
                if i == len(src):
                    return None
                a.append(i)
                pa *= src[i]
            else:
                j += 1
                if j == len(dst):
                    return None
                b.append(j)
                pb *= dst[j]
        if len(a) > 1 and len(b) > 1:
            return None
        out.append((a, b))
        i, j = i + 1, j + 1
    return out


def reshape(n: fx.Node, x: fx.Node, perm: list[int]):
    """``reshape(permute(x, p), S)`` -> ``permute(reshape(x, S'), q)`` when every merged group
    of dims is adjacent and in order in ``x`` as well (dims of size 1 go anywhere)."""
    xs, shape = static_shape(x), static_shape(n)
    if xs is None or shape is None:
        return None
    permuted = [xs[p] for p in perm]
    src_dims = [i for i, s in enumerate(permuted) if s != 1]  # positions in the permuted view
    dst_dims = [j for j, s in enumerate(shape) if s != 1]
    groups = _groups([permuted[i] for i in src_dims], [shape[j] for j in dst_dims])
    if groups is None:
        return None
    x_order = [d for d in range(len(xs)) if xs[d] != 1]  # x's dims larger than 1, in order
    rank_in_x = {d: k for k, d in enumerate(x_order)}
    first_of = {}  # x dim -> the target dims it starts
    for a, b in groups:
        xdims = [perm[src_dims[i]] for i in a]
        ks = [rank_in_x[d] for d in xdims]
        if ks != list(range(ks[0], ks[0] + len(ks))):
            return None  # merged dims that are not neighbours in x: no reshape of x gives them
        first_of[xdims[0]] = [dst_dims[j] for j in b]
    labels = [t for d in x_order for t in first_of.get(d, [])]
    for j, s in enumerate(shape):  # size-1 targets: right after their left neighbour
        if s == 1:
            labels.insert(labels.index(j - 1) + 1 if j else 0, j)
    new_shape = [shape[t] for t in labels]
    return (aten.reshape.default, (x, new_shape)), [labels.index(j) for j in range(len(shape))]


def rule_for(n: fx.Node):
    """The rule that moves a permute of ``n``'s first argument past ``n``, or None."""
    t = n.target
    if t in REDUCTION or t in FULL_REDUCTION:
        return reduction
    if t in ALONG_AXIS or t in AXIS_SIZED:
        return along_axis
    if t is aten.select.int:
        return select
    if t is aten.index.Tensor:
        return index_one
    if t in VIEW:
        return reshape
    return None


def sink_cat(g: fx.Graph, n: fx.Node, is_layout_permute, mark) -> bool:
    """``cat([permute(a, p), permute(b, p)], d)`` -> ``permute(cat([a, b], p[d]), p)``."""
    from .fold_views import permutation

    parts = n.args[0]
    if not parts or not all(is_layout_permute(a) and not a.kwargs for a in parts):
        return False
    perm = permutation(parts[0])
    if any(permutation(a) != perm for a in parts):
        return False
    dim = (n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)) % len(perm)
    with g.inserting_before(n):
        inner = make_node(g, aten.cat.default, ([a.args[0] for a in parts], perm[dim]), like=n)
        out = mark(make_node(g, aten.permute.default, (inner, perm), like=n))
    n.replace_all_uses_with(out)
    g.erase_node(n)
    erase_unused(g, parts)
    return True




def sink_split(g: fx.Graph, n: fx.Node, perm: list[int], mark) -> bool:
    """``split(permute(x, p), s, d)[i]`` -> ``permute(split(x, s, p[d])[i], p)``."""
    src = n.args[0]
    if n.kwargs or not n.users or any(u.target is not operator.getitem for u in n.users):
        return False
    dim = (n.args[2] if len(n.args) > 2 else 0) % len(perm)
    with g.inserting_before(n):
        new = g.call_function(n.target, (src.args[0], n.args[1], perm[dim]))
        new.meta = {k: v for k, v in n.meta.items() if k != "val"}
        new.meta["val"] = infer_val(g, n.target, new.args, {})
    for u in list(n.users):
        with g.inserting_before(u):
            piece = make_node(g, operator.getitem, (new, u.args[1]), like=u)
            out = mark(make_node(g, aten.permute.default, (piece, perm), like=u))
        u.replace_all_uses_with(out)
        g.erase_node(u)
    g.erase_node(n)
    if not src.users:
        g.erase_node(src)
    return True


def sink_one(g: fx.Graph, n: fx.Node, rule, perm: list[int], mark) -> bool:
    """Apply ``rule`` to ``n`` (whose first argument is a permute by ``perm``)."""
    src = n.args[0]
    found = rule(n, src.args[0], perm)
    if found is None:
        return False
    (target, args), out_perm = found
    if n.kwargs.keys() - {"dtype", "keepdim", "half_to_float"}:
        return False
    with g.inserting_before(n):
        inner = new = make_node(g, target, args, dict(n.kwargs), like=n)
        if out_perm is not None and out_perm != list(range(len(out_perm))):
            new = mark(make_node(g, aten.permute.default, (inner, out_perm), like=n))
    if [str(d) for d in new.meta["val"].shape] != [str(d) for d in n.meta["val"].shape]:
        erase_unused(g, [new, inner])  # a form the rule does not cover (it would be a rule bug): leave n alone
        return False
    n.replace_all_uses_with(new)
    g.erase_node(n)
    if not src.users:
        g.erase_node(src)
    return True


__all__ = ["rule_for", "sink_one", "sink_cat", "sink_split"]
