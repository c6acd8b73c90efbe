"""Convolution followed by a per-channel scale and shift (inference BatchNorm) -> one convolution
with the scale and shift folded into its weight and bias, at compile time.

``torch.export`` keeps an eval-mode ``nn.BatchNorm*d`` as ``aten.batch_norm`` (training=False)
or, in transformers' CNNs, ``aten._native_batch_norm_legit_no_training`` (read by ``getitem(0)``).
The family's composite rewrites one whose statistics are constants (buffers) into its affine
form ``x * scale + shift`` (``scale = weight / sqrt(var + eps)``, ``shift = bias - mean * scale``,
constants that fold): two elementwise ops, which the layout pass moves through like any other
when there is no convolution to fold into (a BatchNorm after an ADD, a pre-activation ResNet).
A BatchNorm in training mode, or with run-time statistics, is left to torch's decomposition.

The rules then fold ``conv(x) * s`` into ``conv(x)`` with weight ``w * s`` (per output
channel) and bias ``b * s``, and ``conv(x) + t`` into bias ``b + t`` (the sweep is in graph
order, so ``conv(x) * s + t`` folds both: one convolution): the same
function up to float rounding (the products are formed once at compile time instead of per
pixel; measured in the tests against the unfused graph). They match the convolution as the
decompositions leave it, ``permute(circle.conv2d_nhwc(...))`` (2-D) or
``permute(squeeze(circle.conv2d_nhwc(...), 1))`` (1-D), before the layout pass, and the
channels-last form the layout pass leaves, ``circle.conv2d_nhwc(...) * s`` (a pipeline that fuses
after it; ``explain``, which looks at the final graph, reports its near misses through it).

Checks (named, for ``explain``): the result is floating point; the weight and bias are
constants (no model input upstream); ``s`` and ``t`` are constants or numbers that vary only
along the channel dim (dim 1 of the NCHW / NCL result) and do not broadcast it larger; the
``add`` has no ``alpha``. A scale that depends on the input, or varies along H/W, is not a
per-channel affine and stays a MUL/ADD.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..fx_utils import dtype_of, make_node, number, shape_of, static_shape
from ..dialect.nhwc import conv2d_nhwc
from ..patterns.pattern import Pattern
from ..patterns.rewrite import Rewrite
from ._conv_forms import check_no_activation, conv, conv_node, conv_read_by, ncl, nchw, rewrap
from .registry import Candidate, FusionFamily, register_family

aten = torch.ops.aten


# --------------------------------------------------------------------------- composite

def _const(v) -> bool:
    return isinstance(v, fx.Node) and v.op == "get_attr"


def batch_norm_affine(n: fx.Node, g: fx.Graph):
    """``aten.batch_norm`` in inference with constant statistics -> ``x * scale + shift``
    (``scale``/``shift`` built from the constants; constant folding evaluates them)."""
    x, weight, bias, mean, var, training, _momentum, eps = n.args[:8]
    if training or not (_const(mean) and _const(var)) or any(v is not None and not _const(v) for v in (weight, bias)):
        return None
    shape = shape_of(x)
    if shape is None or len(shape) < 2:
        return None
    per_channel = [-1] + [1] * (len(shape) - 2)
    scale = make_node(g, aten.rsqrt.default, (make_node(g, aten.add.Tensor, (var, float(eps)), like=n),), like=n)
    if weight is not None:
        scale = make_node(g, aten.mul.Tensor, (scale, weight), like=n)
    shift = make_node(g, aten.neg.default, (make_node(g, aten.mul.Tensor, (mean, scale), like=n),), like=n)
    if bias is not None:
        shift = make_node(g, aten.add.Tensor, (shift, bias), like=n)
    scale = make_node(g, aten.reshape.default, (scale, per_channel), like=n)
    shift = make_node(g, aten.reshape.default, (shift, per_channel), like=n)
    return make_node(g, aten.add.Tensor, (make_node(g, aten.mul.Tensor, (x, scale), like=n), shift), like=n)


def legit_no_training_affine(n: fx.Node, g: fx.Graph):
    """``aten._native_batch_norm_legit_no_training`` (what transformers' CNNs export to: a
    tuple read by ``getitem(0)``) -> :func:`batch_norm_affine`; the ``getitem`` readers of the
    result are redirected here (the saved statistics, results 1 and 2, must be unused)."""
    users = list(n.users)
    if not users or any(u.target is not operator.getitem or u.args[1] != 0 for u in users):
        return None
    x, weight, bias, mean, var, momentum, eps = n.args[:7]
    shim = _BatchNormArgs(x, weight, bias, mean, var, eps, n)
    out = batch_norm_affine(shim, g)
    if out is None:
        return None
    for u in users:
        u.replace_all_uses_with(out)
        g.erase_node(u)
    return out


class _BatchNormArgs:
    """``aten.batch_norm``'s argument list (training=False) for another BatchNorm op's node."""

    def __init__(self, x, weight, bias, mean, var, eps, node):
        self.args = (x, weight, bias, mean, var, False, 0.0, eps)
        self.meta, self.node = node.meta, node


# --------------------------------------------------------------------------- patterns

def conv2d_scale(x, w, b, stride, pads, dilation, groups, perm, s):
    return aten.mul.Tensor(nchw(x, w, b, stride, pads, dilation, groups, perm), s)


def conv2d_shift(x, w, b, stride, pads, dilation, groups, perm, t):
    return aten.add.Tensor(nchw(x, w, b, stride, pads, dilation, groups, perm), t)


def nhwc_scale(x, w, b, stride, pads, dilation, groups, s):
    return aten.mul.Tensor(conv(x, w, b, stride, pads, dilation, groups), s)


def nhwc_shift(x, w, b, stride, pads, dilation, groups, t):
    return aten.add.Tensor(conv(x, w, b, stride, pads, dilation, groups), t)


def conv1d_scale(x, w, b, stride, pads, dilation, groups, perm, s):
    return aten.mul.Tensor(ncl(x, w, b, stride, pads, dilation, groups, perm), s)


def conv1d_shift(x, w, b, stride, pads, dilation, groups, perm, t):
    return aten.add.Tensor(ncl(x, w, b, stride, pads, dilation, groups, perm), t)


# --------------------------------------------------------------------------- checks

def _constant(v, depth: int = 8) -> bool:
    """A value that depends on no model input: a number, a ``get_attr``, or ops on those."""
    if not isinstance(v, fx.Node):
        return True
    if v.op == "get_attr":
        return True
    if v.op != "call_function" or depth == 0:
        return False
    return all(_constant(a, depth - 1) for a in v.all_input_nodes)


def _check_float(m):
    dt = dtype_of(m.root)
    return None if dt is not None and dt.is_floating_point else f"the result is {dt}, not floating point"


def _check_constant_weights(m):
    if not _constant(m["w"]):
        return "the convolution's weight is computed at run time"
    if m["b"] is not None and not _constant(m["b"]):
        return "the convolution's bias is computed at run time"
    return None


def _per_channel(v, out_shape, channels: int, dim: int) -> str | None:
    if number(v) is not None and not isinstance(v, fx.Node):
        return None
    if not isinstance(v, fx.Node) or not _constant(v):
        return "it is computed at run time"
    shape = static_shape(v)
    if shape is None or len(shape) > len(out_shape):
        return f"its shape {shape} does not broadcast into the result {list(out_shape)}"
    full = [1] * (len(out_shape) - len(shape)) + list(shape)
    if any(d != 1 for i, d in enumerate(full) if i != dim) or full[dim] not in (1, channels):
        return f"its shape {list(shape)} varies along more than the channel dim of the result {list(out_shape)}"
    return None


def _check_per_channel(m):
    """``s`` and ``t`` are per-channel constants (BatchNorm's form), not per-pixel values."""
    out = static_shape(m.root)
    if out is None or len(out) < 2:
        return "the result's shape is not static"
    if m.root.kwargs.get("alpha", 1) != 1:
        return "the add has an alpha"
    dim = 1 if "perm" in m.bindings else len(out) - 1  # NCHW after the permute back, else NHWC
    channels = out[dim]
    for name in ("s", "t"):
        if name in m.bindings:
            why = _per_channel(m[name], out, channels, dim)
            if why:
                return f"the {'scale' if name == 's' else 'shift'} {why}"
    return None


_CHECKS = (_check_float, _check_constant_weights, check_no_activation, _check_per_channel)


# --------------------------------------------------------------------------- replacement

def _flat(g, v, like):
    return make_node(g, aten.reshape.default, (v, [-1]), like=like) if isinstance(v, fx.Node) else v


def _replace(m, g: fx.Graph):
    conv = conv_node(m)
    w, b = m["w"], m["b"]
    channels = static_shape(conv)[-1]
    s = m["s"] if "s" in m.bindings else None
    t = m["t"] if "t" in m.bindings else None
    if s is not None:
        w_s = make_node(g, aten.reshape.default, (s, [-1, 1, 1, 1]), like=conv) if isinstance(s, fx.Node) else s
        w = make_node(g, aten.mul.Tensor, (w, w_s), like=conv)
    if b is None:
        b = make_node(g, aten.full.default, ([channels], 0.0), {"dtype": dtype_of(conv)}, like=conv)
    if s is not None:
        b = make_node(g, aten.mul.Tensor, (b, _flat(g, s, conv)), like=conv)
    if t is not None:
        b = make_node(g, aten.add.Tensor, (b, _flat(g, t, conv)), like=conv)
    return rewrap(m, g, make_node(g, conv2d_nhwc, (m["x"], w, b, *conv.args[3:]), like=conv))


RULES = [Rewrite(fn.__name__, Pattern(fn), _replace, _CHECKS, produces="conv_batch_norm")
         for fn in (conv2d_scale, conv1d_scale, conv2d_shift, conv1d_shift, nhwc_scale, nhwc_shift)]


def _scaled_conv(n: fx.Node) -> bool:
    """A convolution (or its permute back to NCHW) whose result an unfused MUL / ADD reads
    (the layout pass moves the permute behind constant ones: the NHWC rules explain those)."""
    return conv_read_by(n, (aten.mul.Tensor, aten.add.Tensor))


FAMILY = register_family(FusionFamily(
    "conv_batch_norm", RULES, op=conv2d_nhwc,
    composites={aten.batch_norm.default: batch_norm_affine,
                aten._native_batch_norm_legit_no_training.default: legit_no_training_affine},
    candidates=(Candidate(_scaled_conv, hops=1, require_check=True),),
    title="Conv+BatchNorm", order=10))
