"""Convolution followed by ReLU / ReLU6 -> one convolution whose Circle operator applies the
activation itself (``fused_activation_function`` of CONV_2D / DEPTHWISE_CONV_2D: RELU, RELU6).

``relu(conv(x))``, ``relu6`` / ``hardtanh(0, 6)`` / ``clamp(0, 6)`` / ``clamp(min=0)`` after a
convolution (MobileNet's and ResNet's blocks) otherwise cost one (RELU) or two (MAXIMUM,
MINIMUM) extra operators per convolution and one more pass over the feature map. The fused
form computes ``min(max(y, 0), 6)`` on the same ``y``: exact (measured in the tests against
eager in onert, atol 0). The rules match the convolution as the decompositions leave it,
``permute(circle.conv2d_nhwc(...))`` (2-D) or ``permute(squeeze(...))`` (1-D), before the
layout pass, and the channels-last form after it (``explain`` looks at the final graph);
this family runs after ``conv_batch_norm`` (families run in module-name order), so a
Conv -> BatchNorm -> ReLU block folds into one operator.

Checks (named, for ``explain``): the result is floating point; the bounds are exactly
``(0, None)`` or ``(0, 6)`` (Circle has no other clamp to fuse: ``clamp(0, 4)`` stays a
MAXIMUM + MINIMUM); the convolution has no activation yet.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..fx_utils import dtype_of, make_node, number
from ..ops_nhwc import conv2d_nhwc
from ..patterns.pattern import Pattern
from ..patterns.rewrite import Rewrite
from .registry import Candidate, FusionFamily, register_family

aten = torch.ops.aten


def _conv(x, w, b, stride, pads, dilation, groups):
    return conv2d_nhwc(x, w, b, stride, pads, dilation, groups)


def _nchw(x, w, b, stride, pads, dilation, groups, perm):
    return aten.permute.default(_conv(x, w, b, stride, pads, dilation, groups), perm)


def _ncl(x, w, b, stride, pads, dilation, groups, perm):
    return aten.permute.default(aten.squeeze.dim(_conv(x, w, b, stride, pads, dilation, groups), 1), perm)


def conv2d_relu(x, w, b, stride, pads, dilation, groups, perm):
    return aten.relu.default(_nchw(x, w, b, stride, pads, dilation, groups, perm))


def conv2d_clamp(x, w, b, stride, pads, dilation, groups, perm, lo, hi):
    return aten.clamp.default(_nchw(x, w, b, stride, pads, dilation, groups, perm), lo, hi)


def conv1d_relu(x, w, b, stride, pads, dilation, groups, perm):
    return aten.relu.default(_ncl(x, w, b, stride, pads, dilation, groups, perm))


def conv1d_clamp(x, w, b, stride, pads, dilation, groups, perm, lo, hi):
    return aten.clamp.default(_ncl(x, w, b, stride, pads, dilation, groups, perm), lo, hi)


def nhwc_relu(x, w, b, stride, pads, dilation, groups):
    return aten.relu.default(_conv(x, w, b, stride, pads, dilation, groups))


def nhwc_clamp(x, w, b, stride, pads, dilation, groups, lo, hi):
    return aten.clamp.default(_conv(x, w, b, stride, pads, dilation, groups), lo, hi)


def _conv_node(m) -> fx.Node:
    return next(n for n in m.nodes if n.target is conv2d_nhwc)


def _activation(m) -> str | None:
    """The Circle activation the matched op is, or None."""
    if "lo" not in m.bindings:
        return "relu"
    lo, hi = number(m["lo"]), (None if m["hi"] is None else number(m["hi"]))
    if lo != 0 or (m["hi"] is not None and hi not in (6,)):
        return None
    return "relu" if m["hi"] is None else "relu6"


def _check_float(m):
    dt = dtype_of(m.root)
    return None if dt is not None and dt.is_floating_point else f"the result is {dt}, not floating point"


def _check_bounds(m):
    if _activation(m) is None:
        return f"clamp({m['lo']!r}, {m['hi']!r}) is neither ReLU (0, None) nor ReLU6 (0, 6)"
    return None


def _check_no_activation(m):
    conv = _conv_node(m)
    act = conv.args[7] if len(conv.args) > 7 else conv.kwargs.get("activation", "none")
    return None if act == "none" else f"the convolution already applies {act}"


def _replace(m, g: fx.Graph):
    conv = _conv_node(m)
    new = make_node(g, conv2d_nhwc, (*conv.args[:7], _activation(m)), like=conv)
    squeeze = next((n for n in m.nodes if n.target is aten.squeeze.dim), None)
    if squeeze is not None:
        new = make_node(g, aten.squeeze.dim, (new, 1), like=m.root)
    if "perm" in m.bindings:
        new = make_node(g, aten.permute.default, (new, m["perm"]), like=m.root)
    return new


RULES = [Rewrite(fn.__name__, Pattern(fn), _replace, (_check_float, _check_bounds, _check_no_activation),
                 produces="fused_activation")
         for fn in (conv2d_relu, conv2d_clamp, conv1d_relu, conv1d_clamp, nhwc_relu, nhwc_clamp)]


def _clamped_conv(n: fx.Node) -> bool:
    """A convolution (or its permute back to NCHW) that an unfused clamp reads."""
    src = n.args[0] if n.target in (aten.permute.default, aten.squeeze.dim) and n.args else n
    if isinstance(src, fx.Node) and src.target is aten.squeeze.dim:
        src = src.args[0]
    return (isinstance(src, fx.Node) and src.target is conv2d_nhwc
            and any(u.target in (aten.relu.default, aten.clamp.default) for u in n.users))


FAMILY = register_family(FusionFamily(
    "fused_activation", RULES, op=conv2d_nhwc,
    candidates=(Candidate(_clamped_conv, hops=1, require_check=True),), title="Conv+ReLU"))
