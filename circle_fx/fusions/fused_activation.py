"""Convolution followed by ReLU / ReLU6 -> one convolution whose Circle operator applies the
activation itself (``fused_activation_function`` of CONV_2D / DEPTHWISE_CONV_2D: RELU, RELU6).

``relu(conv(x))``, ``relu6`` / ``hardtanh(0, 6)`` / ``clamp(0, 6)`` / ``clamp(min=0)`` after a
convolution (MobileNet's and ResNet's blocks) otherwise cost one (RELU) or two (MAXIMUM,
MINIMUM) extra operators per convolution and one more pass over the feature map. The fused
form computes ``min(max(y, 0), 6)`` on the same ``y``: exact (measured in the tests against
eager in onert, atol 0). The rules match the convolution as the decompositions leave it,
``permute(circle.conv2d_nhwc(...))`` (2-D) or ``permute(squeeze(...))`` (1-D), before the
layout pass, and the channels-last form after it (``explain`` looks at the final graph);
this family runs after ``conv_batch_norm`` (``order`` 20 > 10), so a Conv -> BatchNorm -> ReLU
block folds into one operator.

Checks (named, for ``explain``): the result is floating point; the bounds are exactly
``(0, None)`` or ``(0, 6)`` (Circle has no other clamp to fuse: ``clamp(0, 4)`` stays a
MAXIMUM + MINIMUM); the convolution has no activation yet.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from ..fx_utils import dtype_of, make_node, number
from ..dialect.nhwc import conv2d_nhwc
from ..patterns.pattern import Pattern
from ..patterns.rewrite import Rewrite
from ._conv_forms import check_no_activation, conv, conv_node, conv_read_by, ncl, nchw, rewrap
from .registry import Candidate, FusionFamily, register_family

aten = torch.ops.aten


def conv2d_relu(x, w, b, stride, pads, dilation, groups, perm):
    return aten.relu.default(nchw(x, w, b, stride, pads, dilation, groups, perm))


def conv2d_clamp(x, w, b, stride, pads, dilation, groups, perm, lo, hi):
    return aten.clamp.default(nchw(x, w, b, stride, pads, dilation, groups, perm), lo, hi)


def conv1d_relu(x, w, b, stride, pads, dilation, groups, perm):
    return aten.relu.default(ncl(x, w, b, stride, pads, dilation, groups, perm))


def conv1d_clamp(x, w, b, stride, pads, dilation, groups, perm, lo, hi):
    return aten.clamp.default(ncl(x, w, b, stride, pads, dilation, groups, perm), lo, hi)


def nhwc_relu(x, w, b, stride, pads, dilation, groups):
    return aten.relu.default(conv(x, w, b, stride, pads, dilation, groups))


def nhwc_clamp(x, w, b, stride, pads, dilation, groups, lo, hi):
    return aten.clamp.default(conv(x, w, b, stride, pads, dilation, groups), lo, hi)


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


def _replace(m, g: fx.Graph):
    c = conv_node(m)
    return rewrap(m, g, make_node(g, conv2d_nhwc, (*c.args[:7], _activation(m)), like=c))


RULES = [Rewrite(fn.__name__, Pattern(fn), _replace, (_check_float, _check_bounds, check_no_activation),
                 produces="fused_activation")
         for fn in (conv2d_relu, conv2d_clamp, conv1d_relu, conv1d_clamp, nhwc_relu, nhwc_clamp)]


def _clamped_conv(n: fx.Node) -> bool:
    """A convolution (or its permute back to NCHW) that an unfused clamp reads."""
    return conv_read_by(n, (aten.relu.default, aten.clamp.default))


FAMILY = register_family(FusionFamily(
    "fused_activation", RULES, op=conv2d_nhwc,
    candidates=(Candidate(_clamped_conv, hops=1, require_check=True),), title="Conv+ReLU",
    order=20))  # after conv_batch_norm: its rules match the convolution BatchNorm folded into
