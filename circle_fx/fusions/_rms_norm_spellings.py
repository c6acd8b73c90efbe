"""RMSNorm's canonicalization rules: the ways people spell a norm's statistics.

They bring other spellings to the ``mean(x**2, dims, keepdim=True)`` form the RMSNorm
patterns look for, so the pattern file does not grow one rule per spelling:

- ``mean(v, -1)[..., None]`` / ``.unsqueeze(-1)`` / ``.view(..., 1)``: re-adding the reduced
  dims right away is ``keepdim=True`` (inserting size-1 dims never moves an element). A
  reduction whose dims are *not* re-added is left alone.
- ``linalg.vector_norm(x, 2, dims, keepdim)`` -> ``sqrt(sum(x**2, dims, keepdim))`` (real x).
- ``sqrt(sum(v, dims)) * N**-0.5`` (or ``/ sqrt(N)``) with N the reduced count ->
  ``sqrt(mean(v, dims))``: the root-mean-square, as ``vector_norm(x) * D**-0.5`` spells it.
- ``sqrt(s) ** 2`` -> ``s`` when ``s`` is a sum or mean of squares (non-negative).
- ``rsqrt(mean(x**2))`` with no epsilon -> ``rsqrt(mean(x**2) + 0.0)``: an RMSNorm with
  epsilon 0 (``x / (vector_norm(x) * D**-0.5)``). Adding 0.0 to a non-negative value is exact.

Not rewritten (they are not RMSNorm): ``x / (rms + eps)`` (epsilon outside the root) and
``F.normalize`` (``x / max(norm, eps)``); they export as plain arithmetic.
Each rule is an exact identity up to float rounding; shapes and dtypes are checked.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from ..fx_utils import (arguments, dtype_of, is_float, keep_if_like, look_through, make_node, number,
                       scaled_operand, shape_of)
from ..op_traits import REDUCTION, SUMMING, VIEW

aten = torch.ops.aten


def readd_reduced_dim(n, g):
    """``unsqueeze/view(mean(v, dims, keepdim=False))`` to the keepdim shape -> keepdim=True."""
    if n.target not in VIEW or not is_float(n):
        return None
    r = n.args[0]
    if not isinstance(r, fx.Node) or not (r.target in SUMMING and r.target in REDUCTION):
        return None
    args = arguments(r)
    x, dims, keepdim = args[0], args[1], args[2]
    shape = shape_of(x)
    if keepdim or not dims or shape is None or args[3] is not None:
        return None
    rank = len(shape)
    kept = [1 if (d in {k % rank for k in dims}) else s for d, s in enumerate(shape)]
    if list(shape_of(n)) != kept:
        return None
    return keep_if_like(g, n, make_node(g, r.target, (x, list(dims), True), like=n))


def vector_norm_to_sqrt_sum(n, g):
    """``linalg_vector_norm(x, 2, dims, keepdim)`` of a real float -> ``sqrt(sum(x**2))``."""
    if n.target is not aten.linalg_vector_norm.default:
        return None
    x, ord_, dims, keepdim, dtype = arguments(n)[:5]
    if number(ord_) != 2.0 or dtype is not None or not is_float(x) or not is_float(n):
        return None
    shape = shape_of(x)
    if shape is None:
        return None
    dims = list(range(len(shape))) if dims is None else list(dims)
    sq = make_node(g, aten.pow.Tensor_Scalar, (x, 2), like=n)
    s = make_node(g, aten.sum.dim_IntList, (sq, dims, bool(keepdim)), like=n)
    return keep_if_like(g, n, make_node(g, aten.sqrt.default, (s,), like=n), s, sq)


def scaled_root_sum_to_root_mean(n, g):
    """``sqrt(sum(v, dims)) * k`` (``/ k``) with ``k**2 * N == 1`` -> ``sqrt(mean(v, dims))``."""
    if n.target not in (aten.mul.Tensor, aten.div.Tensor) or not is_float(n):
        return None
    r, k = scaled_operand(n)
    r = look_through(r)
    if not k or not isinstance(r, fx.Node) or r.target is not aten.sqrt.default:
        return None
    s = look_through(r.args[0])
    if not isinstance(s, fx.Node) or s.target is not aten.sum.dim_IntList or arguments(s)[3] is not None:
        return None
    x, dims, keepdim = arguments(s)[:3]
    shape = shape_of(x)
    if shape is None or not dims:
        return None
    reduced = [shape[d % len(shape)] for d in dims]
    if not all(isinstance(c, int) for c in reduced):
        return None
    factor = k if n.target is aten.mul.Tensor else 1.0 / k
    if not math.isclose(factor * factor * math.prod(reduced), 1.0, rel_tol=1e-6):
        return None
    mean = make_node(g, aten.mean.dim, (x, list(dims), bool(keepdim)), like=n)
    return keep_if_like(g, n, make_node(g, aten.sqrt.default, (mean,), like=n))


def _sum_of_squares(v) -> bool:
    v = look_through(v)
    if not isinstance(v, fx.Node) or not (v.target in SUMMING and v.target in REDUCTION):
        return False
    sq = look_through(v.args[0])
    return isinstance(sq, fx.Node) and sq.target is aten.pow.Tensor_Scalar and number(sq.args[1]) == 2.0


def square_of_root(n, g):
    """``sqrt(s) ** 2`` -> ``s`` for a (non-negative) sum or mean of squares."""
    if n.target is not aten.pow.Tensor_Scalar or number(n.args[1]) != 2.0:
        return None
    r = look_through(n.args[0])
    if not isinstance(r, fx.Node) or r.target is not aten.sqrt.default or not _sum_of_squares(r.args[0]):
        return None
    s = look_through(r.args[0])
    return s if dtype_of(s) == dtype_of(n) and shape_of(s) == shape_of(n) else None


def zero_epsilon(n, g):
    """``rsqrt(mean(x**2))`` -> ``rsqrt(mean(x**2) + 0.0)`` and ``x / sqrt(mean(x**2))`` ->
    ``x * rsqrt(mean(x**2) + 0.0)``: epsilon 0, spelled out."""
    if not is_float(n):
        return None
    if n.target is aten.rsqrt.default:
        v = n.args[0]
    elif n.target is aten.div.Tensor and len(n.args) == 2 and not n.kwargs.get("rounding_mode"):
        r = look_through(n.args[1])
        if not isinstance(r, fx.Node) or r.target is not aten.sqrt.default:
            return None
        v = r.args[0]
    else:
        return None
    if not isinstance(v, fx.Node) or v.target is not aten.mean.dim or not _sum_of_squares(v):
        return None
    scale = make_node(g, aten.rsqrt.default, (make_node(g, aten.add.Tensor, (v, 0.0), like=n),), like=n)
    if n.target is aten.rsqrt.default:
        return keep_if_like(g, n, scale)
    return keep_if_like(g, n, make_node(g, aten.mul.Tensor, (n.args[0], scale), like=n))


RULES = [readd_reduced_dim, vector_norm_to_sqrt_sum, scaled_root_sum_to_root_mean, square_of_root, zero_epsilon]
