"""Channels-last custom ops (``torch.ops.circle.*_nhwc``): convolutions and pools as Circle runs them.

torch computes convolutions and pools on NCHW tensors; Circle's CONV_2D, DEPTHWISE_CONV_2D,
MAX_POOL_2D and AVERAGE_POOL_2D read and write NHWC. The decompositions
(:mod:`circle_fx.layout.decompositions`) rewrite each torch op into
``permute(op_nhwc(permute(x)))``; the layout pass (:mod:`circle_fx.layout.propagate`) then moves the
permutes through elementwise ops so that neighbouring pairs cancel and a whole CNN runs in NHWC.

Arguments keep torch's meaning, except that ``x`` and the result are NHWC and ``padding`` is
explicit per side, ``[top, bottom, left, right]`` (asymmetric and ``padding="same"`` included),
and a convolution may carry the activation Circle fuses into it (``activation``: none, relu,
relu6; set by the ``fused_activation`` family);
weights stay in torch's ``[out, in/groups, kH, kW]`` layout (the lowering reorders the constant
at compile time). Each op has an eager kernel (the torch op between two permutes), so graphs
using them still run in PyTorch; the fake kernel is the same code on fake tensors.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .base import define



def _nchw(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 3, 1, 2)


def _nhwc(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 2, 3, 1).contiguous()


def _torch_pads(padding) -> tuple[int, int, int, int]:
    """``[top, bottom, left, right]`` -> ``F.pad``'s ``(left, right, top, bottom)``."""
    top, bottom, left, right = padding
    return (left, right, top, bottom)


#: the activations Circle's CONV_2D applies to its result (``fused_activation_function``)
ACTIVATIONS = {"none": lambda y: y, "relu": torch.relu, "relu6": lambda y: torch.clamp(y, 0.0, 6.0)}


def _conv2d(x, weight, bias: Optional[torch.Tensor], stride, padding, dilation, groups, activation: str = "none"):
    xp = F.pad(_nchw(x), _torch_pads(padding))
    return ACTIVATIONS[activation](_nhwc(F.conv2d(xp, weight, bias, list(stride), 0, list(dilation), groups)))


def _max_pool2d(x, kernel, stride, padding):
    """Explicit padding with ``-inf``, which never wins a max: the same as torch's padding
    (itself implicit ``-inf``), also for the extra bottom/right rows a ``ceil_mode`` needs."""
    xp = F.pad(_nchw(x), _torch_pads(padding), value=float("-inf"))
    return _nhwc(F.max_pool2d(xp, list(kernel), list(stride)))


def _avg_pool2d(x, kernel, stride, padding, ceil_mode: bool, count_include_pad: bool,
                divisor_override: Optional[int]):
    top, bottom, left, right = padding
    if top != bottom or left != right:
        raise ValueError(f"avg_pool2d_nhwc: padding {list(padding)} must be symmetric (torch's form)")
    return _nhwc(F.avg_pool2d(_nchw(x), list(kernel), list(stride), [top, left], ceil_mode, count_include_pad,
                              divisor_override))


# the fake kernel is the eager one on fake tensors; no traits: a permute never moves through them
conv2d_nhwc = define("conv2d_nhwc(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, "
                     "int[] dilation, int groups, str activation=\"none\") -> Tensor", _conv2d, _conv2d)
max_pool2d_nhwc = define("max_pool2d_nhwc(Tensor x, int[] kernel, int[] stride, int[] padding) -> Tensor",
                         _max_pool2d, _max_pool2d)
avg_pool2d_nhwc = define("avg_pool2d_nhwc(Tensor x, int[] kernel, int[] stride, int[] padding, bool ceil_mode, "
                         "bool count_include_pad, int? divisor_override) -> Tensor", _avg_pool2d, _avg_pool2d)
