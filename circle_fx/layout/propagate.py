"""Layout propagation: move permutes past elementwise ops so that NHWC <-> NCHW pairs meet and cancel.

Every convolution and pool arrives as ``permute(op_nhwc(permute(x, to NHWC)), to NCHW)``
(:mod:`circle_fx.layout.decompositions`). Between two convolutions a CNN only has
elementwise work (BatchNorm's scale and shift, ReLU/ReLU6, hard-swish, residual ADDs), so
this pass rewrites, in one forward sweep,

    op(permute(a, p), permute(b, p), constant, scalar)  ->  permute(op(a, b, constant'), p)

where ``constant'`` is the constant brought to full rank and permuted by ``p``'s inverse
(folded at compile time). The permute then sits right in front of the next convolution's
permute to NHWC and ``fold_views`` (which runs next) cancels the pair; ``nhwc_pads`` (after it)
folds zero pads into convolutions. Ops are rewritten
only when every tensor operand is a permute by the same ``p``, a constant or a scalar, so the
pass never adds a TRANSPOSE at run time (a permute moves past a split only when every piece's
users take it on: one step of lookahead, ``_takes``). ``constant_pad_nd`` moves past a permute too (its pads follow their dims), and a zero pad of H and W
in front of a convolution becomes the convolution's own padding. A permute that only moves size-1 dims (the
``[B, 1, 1, C] -> [B, C, 1, 1]`` after global pooling) keeps the element order: it becomes a
reshape, which folds into the flatten after it.

Ops with axes move a permute by remapping their axes through it (:mod:`.axes`):
reductions, softmax, ``cat``/``split``/``slice``/``select``/one-index gathers, and reshapes that
split dims or merge neighbours (GroupNorm's view, a patch embedding's ``flatten(2).transpose(1, 2)``).
The permutes such a rule leaves (any rank, any order) are marked as layout permutes
(``circle_fx.meta.LAYOUT_PERMUTE``) so later ops move them on; a permute of a permute is composed on the spot
(ConvNeXt's own ``permute(0, 2, 3, 1)`` after a convolution cancels before its LayerNorm).

Exact: values are only moved, never recomputed. O(nodes).
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..fx_utils import erase_unused, make_node, shape_of, static_shape
from ..dialect.nhwc import conv2d_nhwc
from ..meta import LAYOUT_PERMUTE
from ..op_traits import ELEMENTWISE, PERMUTE, SPLIT
from ..pass_protocol import NodePass
from .axes import rule_for, sink_cat, sink_one, sink_split
from .fold_views import permutation

aten = torch.ops.aten

#: the permutes the convolution decompositions produce (to/from NHWC, to/from NLC); others
#: (attention heads...) are left where the model put them
LAYOUT_PERMS = {(0, 2, 3, 1), (0, 3, 1, 2), (0, 2, 1)}


def _is_permute(v) -> bool:
    return isinstance(v, fx.Node) and v.op == "call_function" and v.target in PERMUTE


def _is_layout_permute(v) -> bool:
    return _is_permute(v) and (v.meta.get(LAYOUT_PERMUTE, False) or tuple(permutation(v)) in LAYOUT_PERMS)


def _mark(n: fx.Node) -> fx.Node:
    n.meta[LAYOUT_PERMUTE] = True
    return n


def _pads_per_dim(pads, rank: int) -> list[tuple[int, int]]:
    """torch's pad list (from the last dim backwards) as ``(before, after)`` per dim."""
    per_dim = [(0, 0)] * rank
    for i in range(len(pads) // 2):
        per_dim[rank - 1 - i] = (pads[2 * i], pads[2 * i + 1])
    return per_dim


def _torch_pads(per_dim) -> list[int]:
    out = []
    for before, after in reversed(per_dim):
        out += [before, after]
    return out


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


#: the answer of :func:`_carried` for a constant: it takes any permute
_ANY = "any"


def _carried(a, pieces: dict, memo: dict, depth: int = 12):
    """The permute ``a`` would carry once the split's permute has moved past it: a small
    simulation of the sweep over ``a``'s inputs. ``pieces``: split output -> its permute.
    Returns the permutation, :data:`_ANY` for a constant or scalar, or None (no permute
    would reach it: it stays as it is)."""
    if not isinstance(a, fx.Node) or a.op == "get_attr":
        return _ANY
    if a in pieces:
        return pieces[a]
    if _is_layout_permute(a) and not a.kwargs:  # one already there (another convolution's output)
        return permutation(a)
    if a in memo:
        return memo[a]
    memo[a] = None  # cycles cannot occur in a graph; depth bounds the walk
    out = None
    if depth and a.op == "call_function":
        if a.target in ELEMENTWISE:
            perms = {str(q): q for q in (_carried(b, pieces, memo, depth - 1) for b in a.args) if q is not _ANY}
            if len(perms) == 1 and None not in perms.values():
                out = next(iter(perms.values()))
        elif a.target is operator.getitem:
            src = a.args[0]
            if isinstance(src, fx.Node) and src.op == "call_function" and src.target in SPLIT:
                q = _carried(src.args[0], pieces, memo, depth - 1)
                out = q if q is not _ANY else None
        elif rule_for(a) is not None and isinstance(a.args[0], fx.Node):
            q = _carried(a.args[0], pieces, memo, depth - 1)
            if q is not None and q is not _ANY:
                out = _rule_perm(a, q)
    memo[a] = out
    return out


def _rule_perm(n: fx.Node, perm: list[int]):
    """The permute an axis rule leaves after ``n`` when its input carries ``perm`` (a dry run on
    a stand-in of the unpermuted input): a permutation, ``[]`` when none is left, or None when
    the rule would not move it."""
    shape = static_shape(n.args[0])
    if shape is None:
        return None
    inner = torch.empty([shape[i] for i in _inverse(perm)], device="meta")  # the input before the permute
    try:
        found = rule_for(n)(n, inner, perm)
    except Exception:  # noqa: BLE001 - a rule that cannot say: the permute does not move
        return None
    if found is None:
        return None
    out_perm = found[1]
    return out_perm if out_perm is not None else []


def _takes(user: fx.Node, pieces: dict, memo: dict) -> bool:
    """One step past the split, simulated: does ``user`` (of a piece) take the permute on, so
    that no piece keeps a TRANSPOSE of its own? If one cannot, one TRANSPOSE in front of the
    split would become several (MobileViTv2's linear attention splits a 1x1 convolution's
    output into query / key / value that meet a softmax over the last axis and a product with
    it). Elementwise users must see every operand carry the same permute (FocalNet's gates
    sliced off the split still do); axis rules are dry-run."""
    if user.op != "call_function":
        return False
    if _is_permute(user):
        return True  # composed with it (cancelled, for a convolution's permute to NHWC)
    if user.target in SPLIT or user.target is aten.constant_pad_nd.default or user.target is operator.getitem:
        return True
    if user.target is aten.cat.default:
        return all(_carried(a, pieces, memo) is not None for a in user.args[0])
    return _carried(user, pieces, memo) is not None


class PropagateNHWC(NodePass):
    name = "layout_nhwc"

    def visit(self, program, n) -> bool:
        g = program.gm.graph
        if n.target in ELEMENTWISE:
            return self._sink(g, n)
        if not n.args:
            return False
        x = n.args[0]
        if _is_permute(n) and _is_permute(x):
            return self._compose(g, n)
        if n.target is aten.cat.default:
            return sink_cat(g, n, _is_layout_permute, _mark)
        if not _is_layout_permute(x) or x.kwargs or _is_permute(x.args[0]):
            return False
        if n.target is aten.constant_pad_nd.default:
            return self._sink_pad(g, n)
        if n.target in SPLIT:
            perm = permutation(x)
            pieces, memo = {piece: perm for piece in n.users}, {}
            if not all(_takes(user, pieces, memo) for piece in n.users for user in piece.users):
                return False  # a piece would keep its own TRANSPOSE: one before the split is cheaper
            return sink_split(g, n, perm, _mark)
        rule = rule_for(n)
        return rule is not None and sink_one(g, n, rule, permutation(x), _mark)

    @staticmethod
    def _compose(g: fx.Graph, n: fx.Node) -> bool:
        """A permute of a permute becomes one (or none) here already, so the ops after it see
        the composed order in this same sweep (ConvNeXt's own ``permute(0, 2, 3, 1)`` after a
        convolution's permute to NCHW cancels before its LayerNorm is reached)."""
        src = n.args[0]
        if n.kwargs or src.kwargs:
            return False
        inner = permutation(src)
        perm = [inner[p] for p in permutation(n)]
        with g.inserting_before(n):
            if perm == list(range(len(perm))):
                new = src.args[0]
            else:
                new = make_node(g, aten.permute.default, (src.args[0], perm), like=n)
                if _is_layout_permute(src) or _is_layout_permute(n):
                    _mark(new)
        n.replace_all_uses_with(new)
        g.erase_node(n)
        if not src.users:
            g.erase_node(src)
        return True

    @staticmethod
    def _sink(g: fx.Graph, n: fx.Node) -> bool:
        tensors = [a for a in n.args if isinstance(a, fx.Node)]
        permuted = [a for a in tensors if _is_permute(a)]
        if not permuted or any(a.kwargs for a in permuted):
            return False
        if any(_is_permute(a.args[0]) for a in permuted):
            return False  # a permute of a permute: fold_views composes or cancels them first
        perm = permutation(permuted[0])
        out_shape = shape_of(n)
        if not _is_layout_permute(permuted[0]) or n.kwargs.keys() - {"alpha", "dtype"}:
            return False
        if out_shape is None or all([str(d) for d in out_shape] != [str(d) for d in shape_of(a)] for a in permuted):
            return False  # a constant that broadcasts the result larger: the TRANSPOSE would grow
        for a in tensors:
            if _is_permute(a):
                if permutation(a) != perm:
                    return False
            elif a.op != "get_attr" or len(shape_of(a) or ()) > len(perm):
                return False
        inv = _inverse(perm)
        args = []
        with g.inserting_before(n):
            for a in n.args:
                if _is_permute(a):
                    args.append(a.args[0])
                elif isinstance(a, fx.Node):  # a constant: full rank, then permuted like the data
                    shape = list(shape_of(a))
                    full = make_node(g, aten.reshape.default, (a, [1] * (len(perm) - len(shape)) + shape), like=n)
                    args.append(make_node(g, aten.permute.default, (full, inv), like=n))
                else:
                    args.append(a)
            inner = make_node(g, n.target, tuple(args), dict(n.kwargs), like=n)
            out = _mark(make_node(g, aten.permute.default, (inner, perm), like=n))
        n.replace_all_uses_with(out)
        g.erase_node(n)
        erase_unused(g, permuted)
        return True

    @staticmethod
    def _sink_pad(g: fx.Graph, n: fx.Node) -> bool:
        """``pad(permute(a, p))`` -> ``permute(pad(a, pads moved to a's dims), p)`` (TF-style
        padding in front of a convolution: MobileNetV2, EfficientNet)."""
        src = n.args[0]
        perm = permutation(src)
        per_dim = _pads_per_dim(n.args[1], len(perm))
        moved = [None] * len(perm)
        for i, d in enumerate(perm):
            moved[d] = per_dim[i]
        with g.inserting_before(n):
            inner = make_node(g, aten.constant_pad_nd.default, (src.args[0], _torch_pads(moved), *n.args[2:]), like=n)
            out = _mark(make_node(g, aten.permute.default, (inner, perm), like=n))
        n.replace_all_uses_with(out)
        g.erase_node(n)
        if not src.users:
            g.erase_node(src)
        return True


class NHWCPadsIntoConvs(NodePass):
    """After ``fold_views``: a zero pad in front of a convolution becomes its padding, and a
    layout permute that only moves size-1 dims becomes a reshape."""

    name = "nhwc_pads"

    def visit(self, program, n) -> bool:
        g = program.gm.graph
        if n.target is conv2d_nhwc:
            return self._pad_into_conv(g, n)
        if _is_layout_permute(n):
            return self._as_reshape(g, n)
        return False

    @staticmethod
    def _pad_into_conv(g: fx.Graph, n: fx.Node) -> bool:
        """A zero ``pad`` of H and W only (read directly, or through the permute to NHWC of
        the model's input) becomes the convolution's own padding, so the lowering can pick
        SAME and drop the PAD."""
        x = n.args[0]
        perm = None
        if _is_permute(x) and len(x.users) == 1:
            perm, pad = permutation(x), x.args[0]
        else:
            pad = x
        if not (isinstance(pad, fx.Node) and pad.target is aten.constant_pad_nd.default and len(pad.users) == 1):
            return False
        value = pad.args[2] if len(pad.args) > 2 else 0
        per_dim = _pads_per_dim(pad.args[1], 4)
        if perm is not None:
            per_dim = [per_dim[d] for d in perm]
        if value != 0 or per_dim[0] != (0, 0) or per_dim[3] != (0, 0):
            return False
        (top, bottom), (left, right) = per_dim[1], per_dim[2]
        _, w, b, stride, padding, dilation, groups, *rest = n.args
        padding = [padding[0] + top, padding[1] + bottom, padding[2] + left, padding[3] + right]
        with g.inserting_before(n):
            src = pad.args[0]
            if perm is not None:
                src = make_node(g, aten.permute.default, (src, perm), like=x)
            new = make_node(g, conv2d_nhwc, (src, w, b, stride, padding, dilation, groups, *rest), like=n)
        new.meta["val"] = n.meta["val"]  # the same result: re-inferring can turn static dims symbolic
        n.replace_all_uses_with(new)
        g.erase_node(n)
        if perm is not None:
            g.erase_node(x)
        g.erase_node(pad)
        return True

    @staticmethod
    def _as_reshape(g: fx.Graph, n: fx.Node) -> bool:
        """A permute that keeps the order of the dims larger than 1 is a reshape."""
        src = static_shape(n.args[0])
        out = static_shape(n)
        if src is None or out is None:
            return False
        perm = permutation(n)
        moved = [p for p in perm if src[p] != 1]
        if moved != sorted(moved):
            return False
        with g.inserting_before(n):
            new = make_node(g, aten.reshape.default, (n.args[0], list(out)), like=n)
        n.replace_all_uses_with(new)
        g.erase_node(n)
        return True
