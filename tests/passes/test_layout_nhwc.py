"""The NHWC layout pass (``layout/propagate.py``): a CNN keeps one TRANSPOSE at its input (the
image to NHWC) and at most one at its output, and still matches eager in onert.

Counts are of TRANSPOSE operators in the emitted file; each model is also run in onert.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import circle_fx

from onert_eager import Fn, assert_onert_matches_eager


def _sane_batch_norms(model: nn.Module, seed=0) -> nn.Module:
    """Random running statistics and affine weights, so BatchNorm is not the identity."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model.eval()


class Basic(nn.Module):
    def __init__(self, c_in, c_out, stride):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(),
                               nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False), nn.BatchNorm2d(c_out))
        self.short = (nn.Identity() if stride == 1 and c_in == c_out else
                      nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)))

    def forward(self, x):
        return F.relu(self.a(x) + self.short(x))


class TinyResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 7, 2, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.blocks = nn.Sequential(Basic(8, 8, 1), Basic(8, 16, 2))
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2's block, with TF-style asymmetric padding written as ``F.pad`` in forward."""

    def __init__(self, c, stride):
        super().__init__()
        self.stride = stride
        self.expand = nn.Sequential(nn.Conv2d(c, 4 * c, 1, bias=False), nn.BatchNorm2d(4 * c), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(4 * c, 4 * c, 3, stride, groups=4 * c, bias=False), nn.BatchNorm2d(4 * c),
                                nn.ReLU6())
        self.project = nn.Sequential(nn.Conv2d(4 * c, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        h = self.expand(x)
        h = F.pad(h, (0, 1, 0, 1) if self.stride == 2 else (1, 1, 1, 1))
        h = self.project(self.dw(h))
        return h if self.stride == 2 else x + h


class TinyMobileNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.Hardswish())
        self.blocks = nn.Sequential(InvertedResidual(8, 1), InvertedResidual(8, 2), InvertedResidual(8, 1))
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def _transposes(cm) -> int:
    return cm.op_histogram().get("TRANSPOSE", 0)


IMAGE = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))


#: model -> PADs expected: one per stride-2 conv whose torch padding is symmetric (SAME pads
#: 0 before and 1 after); MobileNet's F.pad in front of each depthwise conv becomes SAME
@pytest.mark.parametrize("model,pads", [(TinyResNet, 2), (TinyMobileNet, 1)])
def test_cnn_has_one_transpose_in_and_at_most_one_out(model, pads):
    torch.manual_seed(0)
    cm = assert_onert_matches_eager(_sane_batch_norms(model()), (IMAGE,), rtol=1e-4, atol=1e-5)
    assert _transposes(cm) <= 2, cm.op_histogram()
    assert cm.op_histogram().get("PAD", 0) == pads, cm.op_histogram()


def test_conv1d_stack_keeps_channels_last():
    """Two 1-D convolutions with a GELU between: the NLC <-> NCL permutes cancel."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.GELU(), nn.Conv1d(8, 8, 3, padding=1, groups=8)).eval()
    cm = assert_onert_matches_eager(m, (torch.randn(1, 4, 12),), rtol=1e-4, atol=1e-5)
    assert _transposes(cm) == 2, cm.op_histogram()


class _Upsampler(nn.Module):
    """A vocoder's shape (HiFi-GAN): leaky ReLU, a transposed 1-D convolution, a residual block of
    dilated 1-D convolutions, a 1-D max pool; every piece enters channels-last the same way."""

    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose1d(8, 4, 4, stride=2, padding=1)
        self.convs = nn.ModuleList([nn.Conv1d(4, 4, 3, dilation=d, padding=d) for d in (1, 3)])
        self.pool = nn.MaxPool1d(3, 1, 1)

    def forward(self, x):
        x = self.up(nn.functional.leaky_relu(x, 0.1))
        for c in self.convs:
            x = x + c(nn.functional.leaky_relu(x, 0.1))
        return torch.tanh(self.pool(x))


def test_1d_upsampler_keeps_channels_last():
    torch.manual_seed(0)
    cm = assert_onert_matches_eager(_Upsampler().eval(), (torch.randn(1, 8, 10),), rtol=1e-4, atol=1e-5)
    assert _transposes(cm) <= 2, cm.op_histogram()


def test_nchw_operand_from_elsewhere_is_not_moved():
    """Near miss: ``conv(x) + x`` adds an NCHW input that is not a permute: the ADD stays in
    NCHW (moving it would need a TRANSPOSE of ``x`` at run time) and the result is exact."""
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 4, 3, padding=1).eval()
    x = torch.randn(1, 4, 6, 6)
    cm = assert_onert_matches_eager(Fn(lambda x: torch.relu(conv(x) + x)), (x,), rtol=1e-4, atol=1e-5)
    assert _transposes(cm) == 2, cm.op_histogram()


def test_transformers_resnet():
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    model = ResNetForImageClassification(ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16],
                                                      depths=[1, 1], layer_type="basic", num_labels=5))
    model = _sane_batch_norms(model)
    cm = circle_fx.export(model, (IMAGE,))
    ref = model(IMAGE).logits.detach().numpy()
    np.testing.assert_allclose(cm.run(IMAGE)[0], ref, rtol=1e-4, atol=1e-5)
    assert _transposes(cm) <= 2, cm.op_histogram()


@pytest.mark.slow
def test_transformers_mobilenet_v2():
    from transformers import MobileNetV2Config, MobileNetV2ForImageClassification

    torch.manual_seed(0)
    model = MobileNetV2ForImageClassification(MobileNetV2Config(num_channels=3, image_size=32, depth_multiplier=0.25,
                                                                num_labels=5))
    model = _sane_batch_norms(model)
    cm = circle_fx.export(model, (IMAGE,))
    ref = model(IMAGE).logits.detach().numpy()
    assert np.abs(ref).max() > 1e-3  # a real signal, not a model that outputs zeros
    np.testing.assert_allclose(cm.run(IMAGE)[0], ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    assert _transposes(cm) <= 2 and "PAD" not in cm.op_histogram(), cm.op_histogram()
