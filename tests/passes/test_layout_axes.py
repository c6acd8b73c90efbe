"""The layout pass's axis rules (``layout/axes.py``): reductions, axis ops, ``cat``,
reshapes and GroupNorm between convolutions stay channels-last, so each model keeps one
TRANSPOSE at its input and one at its output. Every model runs in onert against eager.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import circle_fx

from onert_eager import assert_onert_matches_eager, randn


def _transposes(cm) -> int:
    return cm.op_histogram().get("TRANSPOSE", 0)


class Between(nn.Module):
    """``conv -> fn -> conv``: ``fn`` sees an NCHW tensor that is really an NHWC one permuted."""

    def __init__(self, fn, c_mid=8, c_out=8):
        super().__init__()
        self.fn = fn
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(c_mid, c_out, 1)

    def forward(self, x):
        return self.b(self.fn(self.a(x)))


IMAGE = randn(1, 3, 6, 6)
TOL = dict(rtol=1e-4, atol=1e-5)


class SqueezeExcite(nn.Module):
    """MobileNetV3 / timm style: ``w = x.mean((2, 3), keepdim=True)`` through two 1x1 convs."""

    def __init__(self, c=8):
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(c, 4, 1), nn.Conv2d(4, c, 1)

    def forward(self, x):
        w = x.mean((2, 3), keepdim=True)
        return x * F.hardsigmoid(self.expand(F.relu(self.reduce(w))))


def _channels_first_layer_norm(x, eps=1e-6):
    """ConvNeXt's ``LayerNorm(data_format="channels_first")``: statistics over dim 1."""
    u = x.mean(1, keepdim=True)
    s = (x - u).pow(2).mean(1, keepdim=True)
    return (x - u) / torch.sqrt(s + eps)


def _patch_tokens_round_trip(x):
    """A vision transformer's ``flatten(2).transpose(1, 2)`` and back (SegFormer, LeViT, PVT)."""
    b, c, h, w = x.shape
    t = F.layer_norm(x.flatten(2).transpose(1, 2), [c])
    return t.transpose(1, 2).reshape(b, c, h, w)


class GatedByConv(nn.Module):
    """FocalNet's modulation: a piece of a split times another convolution's output (whose own
    permute to NCHW is already there) plus the other piece."""

    def __init__(self, c=8):
        super().__init__()
        self.h = nn.Conv2d(c, c // 2, 1)

    def forward(self, x):
        a, b = x.split([4, 4], 1)
        return a * self.h(x) + b


#: name -> (fn between two convs, channels it hands on)
CASES = {
    "squeeze_excite_mean_keepdim": (SqueezeExcite(), 8),
    "sum_over_channels_keepdim": (lambda x: x * x.sum(1, keepdim=True), 8),
    "amax_over_spatial_keepdim": (lambda x: x - x.amax((2, 3), keepdim=True), 8),
    "channels_first_layer_norm": (_channels_first_layer_norm, 8),
    "softmax_over_channels": (lambda x: torch.softmax(x, 1), 8),
    "log_softmax_over_channels": (lambda x: torch.log_softmax(x, 1), 8),
    "cat_along_channels": (lambda x: torch.cat([x, torch.relu(x)], 1), 16),
    "slice_of_channels": (lambda x: x[:, 2:6], 4),
    "chunk_along_channels": (lambda x: sum(torch.chunk(x, 2, 1)), 4),
    "split_piece_times_another_conv": (GatedByConv(), 4),
    "group_norm": (nn.GroupNorm(2, 8), 8),
    "group_norm_one_group": (nn.GroupNorm(1, 8), 8),
    "patch_tokens_round_trip": (_patch_tokens_round_trip, 8),
    "index_select_channels": (lambda x: x.index_select(1, torch.tensor([3, 0, 5, 5])), 4),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rule_keeps_channels_last(name):
    fn, c_mid = CASES[name]
    torch.manual_seed(0)
    m = Between(fn if isinstance(fn, nn.Module) else _Fn(fn), c_mid).eval()
    cm = assert_onert_matches_eager(m, (IMAGE,), **TOL)
    assert _transposes(cm) == 2, cm.op_histogram()


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("reduce,out", [
    (lambda x: x.mean((2, 3)), "[B, C]"),
    (lambda x: x.sum(1), "[B, H, W]"),
    (lambda x: x.amax(-1), "[B, C, H]"),
])
def test_reduction_without_keepdim(reduce, out):
    """A reduction that drops axes: the order of the axes left is what stays of the permute
    (``[B, C]`` and ``[B, H, W]`` need none; ``[B, C, H]`` from NHWC's ``[B, H, C]`` needs one)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1).eval()
    cm = assert_onert_matches_eager(_Fn(lambda x: reduce(conv(x))), (IMAGE,), **TOL)
    assert _transposes(cm) == (2 if out == "[B, C, H]" else 1), (out, cm.op_histogram())


def test_convnext_block_permutes_cancel():
    """ConvNeXt: ``dwconv -> permute(0, 2, 3, 1) -> LayerNorm -> MLP -> permute(0, 3, 1, 2)``
    plus the residual: the model's permutes cancel the convolution's, LayerNorm runs over the
    last NHWC axis."""

    class Block(nn.Module):
        def __init__(self, c=8):
            super().__init__()
            self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
            self.norm = nn.LayerNorm(c)
            self.up, self.down = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

        def forward(self, x):
            h = self.dw(x).permute(0, 2, 3, 1)
            h = self.down(F.gelu(self.up(self.norm(h))))
            return x + h.permute(0, 3, 1, 2)

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 2, 2), Block(), Block(), nn.Conv2d(8, 4, 1)).eval()
    cm = assert_onert_matches_eager(m, (randn(1, 3, 8, 8),), **TOL)
    assert _transposes(cm) == 2, cm.op_histogram()


def test_softmax_over_the_last_nchw_axis_stays():
    """Near miss: a softmax over W (NCHW's last axis) would be over NHWC's axis 2, and Circle's
    SOFTMAX runs on the last axis only (the lowering transposes around it): the permute stays
    where it is, four TRANSPOSEs either way."""
    torch.manual_seed(0)
    m = Between(_Fn(lambda x: torch.log_softmax(x, -1))).eval()
    cm = assert_onert_matches_eager(m, (IMAGE,), **TOL)
    assert _transposes(cm) == 4 and "LOG_SOFTMAX" in cm.op_histogram(), cm.op_histogram()


def test_merge_of_dims_apart_in_nhwc_stays_exact():
    """Near miss: ``reshape(B, C*H, W)`` merges C and H, which are not neighbours in NHWC: no
    reshape of the NHWC tensor gives it, so the permute stays in front of it (and the result
    is exact)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1).eval()
    cm = assert_onert_matches_eager(_Fn(lambda x: conv(x).reshape(1, 48, 6) * 2.0), (IMAGE,), **TOL)
    assert _transposes(cm) == 2, cm.op_histogram()


class LinearAttention(nn.Module):
    """MobileViTv2's linear self-attention: a 1x1 convolution's output split into a 1-channel
    query, keys and values; softmax of the query over the positions (NCHW's last axis), the keys
    weighted by it and summed, the values' ReLU times that context, a 1x1 convolution out."""

    def __init__(self, c=8):
        super().__init__()
        self.qkv, self.out = nn.Conv2d(c, 1 + 2 * c, 1), nn.Conv2d(c, c, 1)
        self.c = c

    def forward(self, x):
        q, k, v = self.qkv(x).split([1, self.c, self.c], dim=1)
        ctx = (k * torch.softmax(q, dim=-1)).sum(-1, keepdim=True)
        return self.out(torch.relu(v) * ctx.expand_as(v))


def test_split_whose_pieces_cannot_take_the_permute_stays():
    """Near miss: moving the convolution's permute past the split would leave one on the keys
    and one on the values (the query's softmax and the product with it do not take it): the
    permute stays in front of the split, as many TRANSPOSEs as without the split rule."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), LinearAttention(), nn.Conv2d(8, 4, 1)).eval()
    cm = assert_onert_matches_eager(m, (IMAGE,), **TOL)
    # the input, the qkv convolution's output (once, before the split: 5 when it moved past it),
    # the out convolution's input and the model's output
    assert _transposes(cm) == 4, cm.op_histogram()


@pytest.mark.slow
def test_transformers_convnext():
    from transformers import ConvNextConfig, ConvNextForImageClassification

    torch.manual_seed(0)
    model = ConvNextForImageClassification(ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1],
                                                          num_stages=2, num_labels=5)).eval()
    image = randn(1, 3, 32, 32)
    cm = circle_fx.export(model, (image,))
    ref = model(image).logits.detach().numpy()
    np.testing.assert_allclose(cm.run(image)[0], ref, rtol=1e-4, atol=1e-5)
    assert _transposes(cm) <= 2, cm.op_histogram()
