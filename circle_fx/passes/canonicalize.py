"""Canonicalization: rewrite equivalent spellings into one form so patterns stay few.

One forward sweep; each rule looks at a node whose inputs are already canonical, so
chains (``mul(reciprocal(sqrt(v)), 1)``) collapse in the same sweep. O(nodes).

Every rule is an exact algebraic identity on floating tensors (``x*x == x**2``,
``1/sqrt(v) == rsqrt(v)`` up to rounding, ``sum(x)/N == mean(x)``); dtypes and shapes
are checked to be unchanged before a node is replaced.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
import torch.fx as fx

from ..fx_utils import (arguments, dtype_of, is_float, is_noop, keep_if_like, look_through, make_node, number,
                        scaled_operand, shape_of)
from ..op_traits import CAST, SIDE_EFFECT_ONLY
from ..fusions.registry import canonical_rules
from ..pass_protocol import Pass

aten = torch.ops.aten
Rule = Callable[[fx.Node, fx.Graph], Optional[fx.Node]]


def square_to_pow(n, g):
    if n.target is aten.square.default and is_float(n.args[0]):
        return make_node(g, aten.pow.Tensor_Scalar, (n.args[0], 2), like=n)
    if n.target is aten.mul.Tensor and is_float(n):
        a, b = look_through(n.args[0]), look_through(n.args[1])
        if isinstance(a, fx.Node) and a is b:
            return make_node(g, aten.pow.Tensor_Scalar, (a, 2), like=n)
    return None


def multiply_by_one(n, g):
    if n.target in (aten.mul.Tensor, aten.div.Tensor) and is_float(n):
        a, b = n.args[0], n.args[1]
        if n.target is aten.mul.Tensor and number(a) == 1.0:
            a, b = b, a
        if number(b) == 1.0 and isinstance(a, fx.Node) and dtype_of(a) == dtype_of(n) and shape_of(a) == shape_of(n):
            return a
    return None


def reciprocal_sqrt(n, g):
    """``reciprocal(sqrt(v))`` and ``pow(v, -0.5)`` -> ``rsqrt(v)``; ``pow(v, .5)`` -> ``sqrt``."""
    if n.target is aten.reciprocal.default:
        s = look_through(n.args[0])
        if isinstance(s, fx.Node) and s.target is aten.sqrt.default and is_float(s):
            return make_node(g, aten.rsqrt.default, (s.args[0],), like=n)
    if n.target is aten.pow.Tensor_Scalar and is_float(n.args[0]):
        e = number(n.args[1])
        if e == -0.5:
            return make_node(g, aten.rsqrt.default, (n.args[0],), like=n)
        if e == 0.5:
            return make_node(g, aten.sqrt.default, (n.args[0],), like=n)
    return None


def divide_by_sqrt(n, g):
    """``x / sqrt(v)`` -> ``x * rsqrt(v)``."""
    if n.target is aten.div.Tensor and len(n.args) == 2 and not n.kwargs.get("rounding_mode"):
        s = look_through(n.args[1])
        if isinstance(s, fx.Node) and s.target is aten.sqrt.default and is_float(n):
            r = make_node(g, aten.rsqrt.default, (s.args[0],), like=n)
            new = make_node(g, aten.mul.Tensor, (n.args[0], r), like=n)
            if dtype_of(new) == dtype_of(n) and shape_of(new) == shape_of(n):
                return new
            g.erase_node(new)
            g.erase_node(r)
    return None


def reduction_dtype_to_cast(n, g):
    """``mean/sum(x, dims, keepdim, dtype=d)`` -> ``mean/sum(x.to(d), dims, keepdim)``:
    torch casts the input before reducing, so this is exact; with ``d`` already the input's
    dtype the cast disappears, and patterns never have to spell the ``dtype`` argument."""
    if n.target not in (aten.mean.dim, aten.sum.dim_IntList):
        return None
    args = arguments(n)
    x, dims, keepdim, dtype = args[:4]
    if dtype is None or not isinstance(x, fx.Node) or not is_float(x) or not is_float(n):
        return None  # integer sums promote to int64 on their own: not a plain cast there
    made = []
    if dtype != dtype_of(x):
        x = make_node(g, aten._to_copy.default, (x,), {"dtype": dtype}, like=n)
        made.append(x)
    return keep_if_like(g, n, make_node(g, n.target, (x, dims, keepdim), like=n), *made)


def sum_to_mean(n, g):
    """``sum(x, dims, keepdim) / N`` (or ``* (1/N)``) with N the reduced count -> ``mean``."""
    if n.target not in (aten.div.Tensor, aten.mul.Tensor) or not is_float(n):
        return None
    s, k = scaled_operand(n)
    if k is None or k == 0 or not isinstance(s, fx.Node) or s.target is not aten.sum.dim_IntList:
        return None
    x, dims, keepdim = arguments(s)[:3]
    shape = shape_of(x)
    if shape is None or not dims or not is_float(x) or arguments(s)[3] is not None:
        return None
    reduced = [shape[d % len(shape)] for d in dims]
    if not all(isinstance(c, int) for c in reduced):
        return None  # only the reduced dims must be static (batch/sequence may be dynamic)
    count = math.prod(reduced)
    factor = 1.0 / k if n.target is aten.div.Tensor else k
    if not math.isclose(factor * count, 1.0, rel_tol=1e-6):
        return None
    return make_node(g, aten.mean.dim, (x, list(dims), bool(keepdim)), like=n)


def merge_duplicate_casts(n, g):
    """A second identical cast of one value (``x.float()`` written twice, as in
    ``x.float() * rsqrt(x.float().pow(2).mean(-1))``) -> the first one, so patterns that
    say "the same ``x`` in both places" see one node. Only casts: they are pure and cheap,
    and merging arbitrary ops could create sharing that blocks other fusions."""
    if n.target not in CAST or not n.args or not isinstance(n.args[0], fx.Node):
        return None
    for u in n.args[0].users:
        if (u is not n and u.op == "call_function" and u.target is n.target and u.args == n.args
                and u.kwargs == n.kwargs and u < n):
            return u
    return None


#: the generic rules; each fusion family adds its own spellings (``FusionFamily.canonical``)
RULES: list[Rule] = [square_to_pow, multiply_by_one, reciprocal_sqrt, divide_by_sqrt, reduction_dtype_to_cast, sum_to_mean]


def default_rules() -> list[Rule]:
    """Duplicate casts merged first, then the registered families' spellings, then :data:`RULES`."""
    return [merge_duplicate_casts, *canonical_rules(), *RULES]


class Canonicalize(Pass):
    """Remove no-op nodes and bring equivalent spellings to one canonical form."""

    name = "canonicalize"

    def __init__(self, rules: list[Rule] | None = None):
        super().__init__()
        self.rules = default_rules() if rules is None else list(rules)

    def run(self, program) -> bool:
        g = program.gm.graph
        changed = False
        for n in list(g.nodes):
            if n.op != "call_function" or getattr(n, "_erased", False):
                continue
            if n.target in SIDE_EFFECT_ONLY and not n.users:
                g.erase_node(n)
                changed = True
                continue
            if is_noop(n):
                n.replace_all_uses_with(n.args[0])
                g.erase_node(n)
                changed = True
                continue
            new = None
            with g.inserting_before(n):  # once per node, not per rule (rules x nodes context switches)
                for rule in self.rules:
                    new = rule(n, g)
                    if new is not None and new is not n:
                        break
            if new is not None and new is not n:
                n.replace_all_uses_with(new)
                g.erase_node(n)
                changed = True
        return changed
