"""RMSNorm: the pattern library that collapses ``x * rsqrt(mean(x**2, -1) + eps) * w``.

Only a few shapes are listed here because canonicalization has already reduced the many
real spellings to one (``x*x``/``square`` -> ``pow(x, 2)``, ``sum/N`` -> ``mean``,
``1/sqrt``/``pow(-0.5)`` -> ``rsqrt``, ``x/sqrt`` -> ``x*rsqrt``, no-op casts removed,
duplicate casts merged); what remains are genuinely different associations of the muls:

1. ``rms_core``: the normalisation itself, optionally with the variance computed on an
   up-cast copy of ``x`` (T5, Llama in half precision);
2. ``rms_weight_inside``: ``(x * w) * rsqrt(...)``, weight applied before the scale;
   ``rms_weight_on_scale``: ``x * (rsqrt(...) * w)``, weight folded into the scale first;
3. ``rms_absorb_weight``: ``rms_norm(x) * w`` (through an optional cast) folds the weight
   into an existing fused node — so Llama's cast-before-weight, GPT-OSS's cast-after and
   Gemma's ``(1 + w)`` (a constant after folding) all end as one node;
4. ``rms_scale_after_linear`` / ``rms_scale_after_matmul``: ``linear(x, W) * rsqrt(mean(x**2) + eps)``
   (HY-V4's unweighted norm, applied to the mixing projection's output). A bias-free linear
   commutes with a per-row scale, so this is ``linear(rms_norm(x), W)``. Only when the
   projection's input is the normalised ``x`` itself, it adds no bias (a bias would be
   scaled too) and the result keeps the projection's shape and dtype.

``torch.nn.RMSNorm`` exports as one ``aten.rms_norm`` op: the family owns that mapping
too (:func:`aten_rms_norm_to_circle`, run by the decompose pass), so the one place that
knows what ``circle.rms_norm`` means is this file.

The family owns its op (``circle.rms_norm``: schema, eager and fake kernel, below) and the
canonicalizing rules that bring other spellings of the statistics to the form its patterns
read (:mod:`._rms_norm_spellings`, run by the canonicalize pass), and its lowering
(:func:`lower_rms_norm`, to Circle's builtin RMS_NORM).

Everything the graph shape cannot express is a named check with a message for ``explain``;
the ``CANDIDATES`` at the end tell ``explain`` what an unfused RMSNorm looks like.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
import torch.fx as fx

from ..circle.schema import BO, make_options
from ..fx_utils import arguments, dtype_of, look_through, make_node, shape_of, strip_casts
from ..op_traits import CAST, SQUARING, SUMMING
from ..dialect import define
from ..patterns.matcher import Match
from ..patterns.pattern import Pattern, optional_cast
from ..patterns.rewrite import Rewrite
from ..program import fetch_attr
from ..source import describe
from ._rms_norm_spellings import RULES as SPELLINGS
from .registry import Candidate, FusionFamily, register_family


def rms_norm_eager(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in at least float32, returned in ``x.dtype``.

    Accumulating in float32 is what every real spelling does (Llama, Gemma, T5 cast up
    before the reduction), so doing it here keeps fused half-precision graphs faithful.
    """
    compute = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(compute)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(compute)
    return y.to(x.dtype)


def _rms_norm_fake(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    return torch.empty_like(x)


#: ``torch.ops.circle.rms_norm.default``
rms_norm = define("rms_norm(Tensor x, Tensor? weight, float eps) -> Tensor", rms_norm_eager, _rms_norm_fake)

aten = torch.ops.aten


def _variance(x, dims, keepdim):
    return aten.mean.dim(aten.pow.Tensor_Scalar(optional_cast(x), 2), dims, keepdim)


def rms_core(x, dims, keepdim, eps):
    return aten.mul.Tensor(x, aten.rsqrt.default(aten.add.Tensor(_variance(x, dims, keepdim), eps)))


def rms_weight_inside(x, w, dims, keepdim, eps):
    return aten.mul.Tensor(aten.mul.Tensor(x, w),
                           aten.rsqrt.default(aten.add.Tensor(_variance(x, dims, keepdim), eps)))


def rms_weight_on_scale(x, w, dims, keepdim, eps):
    return aten.mul.Tensor(x, aten.mul.Tensor(aten.rsqrt.default(aten.add.Tensor(_variance(x, dims, keepdim), eps)),
                                              w))


def rms_absorb_weight(x, eps, w):
    return aten.mul.Tensor(optional_cast(rms_norm(x, None, eps)), w)


def _scale(x, dims, keepdim, eps):
    return optional_cast(aten.rsqrt.default(aten.add.Tensor(_variance(x, dims, keepdim), eps)))


def rms_scale_after_linear(x, w, b, dims, keepdim, eps):
    return aten.mul.Tensor(aten.linear.default(x, w, b), _scale(x, dims, keepdim, eps))


def rms_scale_after_matmul(x, w, dims, keepdim, eps):
    return aten.mul.Tensor(aten.matmul.default(x, w), _scale(x, dims, keepdim, eps))


# --------------------------------------------------------------------------- checks

def _check_float_input(m: Match):
    dt = dtype_of(m["x"])
    if dt is None or not dt.is_floating_point:
        return f"the normalised value has dtype {dt}, not a floating type"
    return None


def _check_last_axis(m: Match):
    dims, keepdim, x = m["dims"], m["keepdim"], m["x"]
    shape = shape_of(x)
    if not isinstance(dims, (list, tuple)) or shape is None:
        return f"mean over {dims!r} is not a reduction over a list of axes"
    ndim = len(shape)
    if len(dims) != 1:
        return f"mean reduces {len(dims)} axes {list(dims)}; RMSNorm reduces only the last axis"
    if not isinstance(dims[0], int) or dims[0] % max(ndim, 1) != ndim - 1:
        return f"mean reduces axis {dims[0]} of a {ndim}-D tensor, not the last axis"
    if keepdim is not True:
        return "mean has keepdim=False, so the result does not broadcast back over the last axis"
    return None


def _eps_value(eps):
    if isinstance(eps, bool):
        return None
    if isinstance(eps, (int, float)):
        return float(eps)
    if isinstance(eps, fx.Node) and eps.op == "get_attr":
        t = fetch_attr(eps.graph.owning_module, eps.target)
        if isinstance(t, torch.Tensor) and t.numel() == 1 and t.is_floating_point():
            return float(t.reshape(()).item())
    return None


def _check_eps(m: Match):
    value = _eps_value(m["eps"])
    if value is None:
        eps = m["eps"]
        what = describe(eps) if isinstance(eps, fx.Node) else repr(eps)
        return f"the term added to the variance ({what}) is not a constant scalar epsilon"
    if not math.isfinite(value) or value < 0:
        return f"epsilon {value} is negative or not finite"
    return None


def _check_not_centred(m: Match):
    # casts are stripped: in half precision LayerNorm is often ``(x - mean(x)).float()``
    x = strip_casts(m["x"])
    if isinstance(x, fx.Node) and x.target is aten.sub.Tensor:
        a, mu = strip_casts(x.args[0]), strip_casts(x.args[1])
        if isinstance(mu, fx.Node) and mu.target is aten.mean.dim and strip_casts(mu.args[0]) is a:
            return "the input is mean-centred (x - mean(x)): this is LayerNorm, not RMSNorm"
    return None


def _check_weight(m: Match):
    w, x = m["w"], m["x"]
    if not isinstance(w, fx.Node) or not isinstance(w.meta.get("val"), torch.Tensor):
        return f"the scale {w!r} is not a tensor"
    ws, xs = shape_of(w), shape_of(x)
    d = xs[-1] if xs else None
    squeezed = list(ws)
    while len(squeezed) > 1 and squeezed[0] == 1:
        squeezed.pop(0)
    if len(ws) > len(xs) or len(squeezed) != 1 or squeezed[0] != d:
        return f"weight shape {list(ws)} does not match the normalised dimension {d}"
    if not dtype_of(w).is_floating_point:
        return f"weight dtype {dtype_of(w)} is not floating point"
    return None


def _check_shape_kept(m: Match):
    # a norm keeps its input's shape; an operand that broadcasts further (an epsilon
    # tensor of shape [1, 1, 1, 1] added to a 3-D variance) would be lost by the fused op
    if shape_of(m.root) != shape_of(m["x"]):
        return f"the result has shape {list(shape_of(m.root))}, not the input's {list(shape_of(m['x']))}"
    return None


def _check_casts_to_float(m: Match):
    # optional_cast accepts any conversion; a cast to an integer or bool type rounds the
    # value, which the fused op would not
    for n in m.nodes:
        if n.op == "call_function" and n.target in CAST and not dtype_of(n).is_floating_point:
            return f"{describe(n)} converts to {dtype_of(n)}, not a floating type"
    return None


def _check_variance_not_narrowed(m: Match):
    # optional_cast accepts any conversion; only a widening one (T5, Llama in half) keeps
    # the fused op's float32 accumulation faithful to the graph
    for n in m.nodes:
        if n.target is aten.pow.Tensor_Scalar:
            src = look_through(n.args[0])
            if src is not look_through(m["x"]) and dtype_of(src).itemsize < dtype_of(m["x"]).itemsize:
                return f"the variance is computed in {dtype_of(src)}, narrower than the input's {dtype_of(m['x'])}"
    return None


def _projection(m: Match) -> fx.Node:
    return next(n for n in m.nodes if n.target in (aten.linear.default, aten.matmul.default))


def _check_no_bias(m: Match):
    # linear(x, W, b) * s == linear(x * s, W) + b * s: the bias would be scaled too
    b = m["b"]
    if b is not None:
        return f"the linear adds a bias ({describe(b) if isinstance(b, fx.Node) else repr(b)}), " \
               "which the row scale multiplies too: not linear(rms_norm(x), W)"
    return None


def _check_projection_kept(m: Match):
    # the scale ([..., 1]) must broadcast along the projection's output only: a 1-D
    # right-hand side drops the row axis, and a wider scale would change the shape; the
    # dtypes must agree so the one fused node computes in the graph's precision
    proj = _projection(m)
    if shape_of(m.root) != shape_of(proj):
        return f"the scaled result has shape {list(shape_of(m.root))}, not the projection's {list(shape_of(proj))}"
    if not (dtype_of(m.root) == dtype_of(proj) == dtype_of(m["x"])):
        return (f"the projection computes in {dtype_of(proj)} and the result is {dtype_of(m.root)}, "
                f"the normalised value {dtype_of(m['x'])}: not one precision")
    for n in m.nodes:
        if n.target in CAST and dtype_of(n).itemsize < dtype_of(m["x"]).itemsize:
            return f"{describe(n)} rounds the scale to {dtype_of(n)}, narrower than the input's {dtype_of(m['x'])}"
    return None


# ----------------------------------------------------------------------- replacement

def _emit_rms(m: Match, graph: fx.Graph, weight) -> fx.Node:
    x, root = m["x"], m.root
    out_dtype = dtype_of(root)
    if out_dtype.itemsize > dtype_of(x).itemsize:
        x = make_node(graph, aten._to_copy.default, (x,), {"dtype": out_dtype}, like=root)
    if weight is not None:
        ws = shape_of(weight)
        if len(ws) != 1:
            weight = make_node(graph, aten.reshape.default, (weight, [ws[-1]]), like=root)
        if dtype_of(weight) != dtype_of(x) and dtype_of(weight).itemsize <= dtype_of(x).itemsize:
            # exact widening, folded at compile time for constant weights, so the runtime
            # never converts (onert cannot CAST from float16)
            weight = make_node(graph, aten._to_copy.default, (weight,), {"dtype": dtype_of(x)}, like=root)
    node = make_node(graph, rms_norm, (x, weight, _eps_value(m["eps"])), like=root)
    if dtype_of(node) != out_dtype:
        node = make_node(graph, aten._to_copy.default, (node,), {"dtype": out_dtype}, like=root)
    return node


def _replace_core(m, graph):
    return _emit_rms(m, graph, None)


def _replace_weighted(m, graph):
    return _emit_rms(m, graph, m["w"])


def _replace_projection(m, graph):
    proj, root = _projection(m), m.root
    normed = make_node(graph, rms_norm, (m["x"], None, _eps_value(m["eps"])), like=root)
    return make_node(graph, proj.target, (normed,) + tuple(proj.args[1:]), dict(proj.kwargs), like=root)


_CORE_CHECKS = (_check_float_input, _check_last_axis, _check_eps, _check_not_centred, _check_variance_not_narrowed)
#: last on every rule, so the more specific messages above win in ``explain``
_SOUND_CHECKS = (_check_shape_kept, _check_casts_to_float)

RULES = [
    Rewrite("rms_norm_weight_inside", Pattern(rms_weight_inside), _replace_weighted,
            _CORE_CHECKS + (_check_weight,) + _SOUND_CHECKS, produces="rms_norm"),
    Rewrite("rms_norm_weight_on_scale", Pattern(rms_weight_on_scale), _replace_weighted,
            _CORE_CHECKS + (_check_weight,) + _SOUND_CHECKS, produces="rms_norm"),
    Rewrite("rms_norm", Pattern(rms_core), _replace_core, _CORE_CHECKS + _SOUND_CHECKS, produces="rms_norm"),
    Rewrite("rms_norm_weight", Pattern(rms_absorb_weight), _replace_weighted,
            (_check_weight,) + _SOUND_CHECKS, produces="rms_norm"),
    Rewrite("rms_norm_before_linear", Pattern(rms_scale_after_linear), _replace_projection,
            _CORE_CHECKS + (_check_no_bias, _check_projection_kept, _check_casts_to_float), produces="rms_norm"),
    Rewrite("rms_norm_before_matmul", Pattern(rms_scale_after_matmul), _replace_projection,
            _CORE_CHECKS + (_check_projection_kept, _check_casts_to_float), produces="rms_norm"),
]
"""The RMSNorm rules, tried in this order at each candidate root."""


# ------------------------------------------------------------ composite: aten.rms_norm

def aten_rms_norm_to_circle(n: fx.Node, g: fx.Graph) -> fx.Node | None:
    """``aten.rms_norm`` (``nn.RMSNorm``, ``F.rms_norm``) -> ``circle.rms_norm``.

    Normalising over the last axis only is exactly ``circle.rms_norm``; over several
    trailing axes it has no Circle counterpart and is spelled out in primitive aten ops
    (which the emitter lowers one by one). Semantics follow torch's own decomposition
    (``_fused_rms_norm``): compute in at least float32, ``eps=None`` means
    ``finfo(compute dtype).eps``, result in the input dtype.
    """
    x, normalized_shape, weight, eps = arguments(n)[:4]
    xdt, shape = dtype_of(x), shape_of(x)
    if xdt is None or not xdt.is_floating_point or shape is None or not normalized_shape:
        return None
    compute = torch.promote_types(xdt, torch.float32)
    eps = float(torch.finfo(compute).eps if eps is None else eps)
    k = len(normalized_shape)
    if k == 1:
        return make_node(g, rms_norm, (x, weight, eps), like=n)
    xf = x if compute == xdt else make_node(g, aten._to_copy.default, (x,), {"dtype": compute}, like=n)
    dims = [len(shape) - 1 - i for i in range(k)]
    var = make_node(g, aten.mean.dim, (make_node(g, aten.pow.Tensor_Scalar, (xf, 2), like=n), dims, True), like=n)
    scale = make_node(g, aten.rsqrt.default, (make_node(g, aten.add.Tensor, (var, eps), like=n),), like=n)
    y = make_node(g, aten.mul.Tensor, (xf, scale), like=n)
    if weight is not None:
        y = make_node(g, aten.mul.Tensor, (y, weight), like=n)
    if dtype_of(y) != xdt:
        y = make_node(g, aten._to_copy.default, (y,), {"dtype": xdt}, like=n)
    return y


# --------------------------------------------------------------- explain candidates

#: how far downstream of a candidate an attempt's root may be (mul, rsqrt, add, mul, mul,
#: cast: the longest RMSNorm spelling from the reduction to its last op)
HOPS = 6


def reduces_a_square(n: fx.Node) -> bool:
    v = strip_casts(n.args[0]) if n.args else None
    return n.target in SUMMING and isinstance(v, fx.Node) and v.op == "call_function" and v.target in SQUARING


def _unweighted_fused(n: fx.Node) -> bool:
    return n.target is rms_norm and n.args[1] is None


CANDIDATES = (
    Candidate(reduces_a_square, hops=HOPS),
    Candidate(lambda n: n.target is aten.rsqrt.default, hops=HOPS, skip_near_reported=True),
    # fused, but a following weight multiplication was refused by a check
    Candidate(_unweighted_fused, kind="rms_norm weight", hops=2, require_check=True),
)

def lower_rms_norm(ctx, node):
    """``circle.rms_norm`` -> Circle's builtin ``RMS_NORM`` (gamma is ones when unweighted).

    Any rank, any shape: onert's RMS_NORM kernel accepts only 3-D and 4-D inputs, and the ``ranks``
    legalization step (``emit/legalize/ranks.py``) reshapes other ranks to ``[1, rows, D]``
    around it; it runs static shapes only, and the ``dynamic_rms_norm`` step
    (``emit/legalize/forms.py``) decomposes one with a dynamic dim."""
    x, weight, eps = node.args
    if weight is None:
        d = ctx.shape_hint(x)[-1]
        gamma = ctx.const(np.ones([d], dtype=ctx.numpy_dtype(ctx.dtype(x))), "ones")
    else:
        gamma = ctx.operand(weight, ctx.dtype(x))  # CAST when the weight's dtype differs
    ctx.op(BO.RMS_NORM, [ctx.tensor(x), gamma], [ctx.output(node)],
           make_options("RmsNormOptions", epsilon=float(eps)))


FAMILY = register_family(FusionFamily(
    "rms_norm", RULES, op=rms_norm, lowering=lower_rms_norm, composites={aten.rms_norm.default: aten_rms_norm_to_circle},
    candidates=CANDIDATES, canonical=SPELLINGS, title="RMSNorm",
    no_rule_hint="no RMSNorm rule is rooted near it (nothing multiplies the input by its rsqrt scale)", order=50))
