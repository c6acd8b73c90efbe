"""The Conv+BatchNorm family: an inference BatchNorm (or any per-channel scale / shift) after a
convolution folds into the convolution's weight and bias at compile time.

Spellings it claims fold (no MUL / ADD left) and run in onert against eager; near misses
(a per-pixel scale, a run-time scale, a convolution whose result is also used elsewhere) stay
unfused, name their check and still match; a BatchNorm with no convolution before it becomes
one MUL and one ADD; a hypothesis test draws convolutions and statistics and checks that the
fused graph computes what the unfused model does.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import circle_fx
from circle_fx.passes import default_pipeline, finalize_pipeline, run_passes


def _randomize(bn: torch.nn.Module, gen: torch.Generator) -> None:
    with torch.no_grad():
        c = bn.num_features
        bn.running_mean.copy_(torch.randn(c, generator=gen))
        bn.running_var.copy_(torch.rand(c, generator=gen) * 2 + 0.2)
        if bn.weight is not None:
            bn.weight.copy_(torch.randn(c, generator=gen))
            bn.bias.copy_(torch.randn(c, generator=gen))


class ConvBN(torch.nn.Module):
    def __init__(self, dims=2, c_in=3, c_out=8, k=3, stride=1, groups=1, bias=True, affine=True, padding=1, seed=0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        conv, bn = (torch.nn.Conv2d, torch.nn.BatchNorm2d) if dims == 2 else (torch.nn.Conv1d, torch.nn.BatchNorm1d)
        self.conv = conv(c_in, c_out, k, stride=stride, padding=padding, groups=groups, bias=bias)
        self.bn = bn(c_out, affine=affine)
        _randomize(self.bn, gen)
        self.eval()

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class HandScaled(torch.nn.Module):
    """A per-channel scale and shift written by hand (``conv(x) * s + t``), or per pixel."""

    def __init__(self, scale_shape=(1, 8, 1, 1)):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.register_buffer("s", torch.randn(*scale_shape))
        self.register_buffer("t", torch.randn(8, 1, 1))

    def forward(self, x):
        return self.conv(x) * self.s + self.t


class RunTimeScale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x, s):
        return self.conv(x) * s


class ConvUsedTwice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        _randomize(self.bn, torch.Generator().manual_seed(1))
        self.eval()

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


class BNFirst(torch.nn.Module):
    """BatchNorm on the input, before any convolution: nothing to fold into."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.bn = torch.nn.BatchNorm2d(3)
        _randomize(self.bn, torch.Generator().manual_seed(1))
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.eval()

    def forward(self, x):
        return self.conv(self.bn(x))


def _export_and_compare(model, *inputs):
    cm = circle_fx.export(model, inputs)
    np.testing.assert_allclose(cm.run(*inputs)[0], model(*inputs).detach().numpy(), rtol=1e-4, atol=1e-5)
    return dict(cm.op_histogram())


@pytest.mark.parametrize("model,x", [
    (ConvBN(), torch.randn(1, 3, 9, 9)),
    (ConvBN(bias=False, stride=2), torch.randn(2, 3, 9, 9)),
    (ConvBN(c_in=8, groups=8, bias=False), torch.randn(1, 8, 6, 6)),
    (ConvBN(affine=False), torch.randn(1, 3, 5, 5)),
    (ConvBN(dims=1), torch.randn(1, 3, 12)),
    (HandScaled(), torch.randn(1, 3, 6, 6)),
], ids=["conv2d", "no_bias_stride2", "depthwise", "bn_no_affine", "conv1d", "hand_written"])
def test_spellings_fold_into_the_convolution_and_match_eager_in_onert(model, x):
    hist = _export_and_compare(model, x)
    assert "MUL" not in hist and "ADD" not in hist and "SUB" not in hist, hist
    assert hist.get("CONV_2D", 0) + hist.get("DEPTHWISE_CONV_2D", 0) == 1


@pytest.mark.parametrize("model,inputs,check", [
    (HandScaled(scale_shape=(1, 1, 6, 6)), (torch.randn(1, 3, 6, 6),), "_check_per_channel"),
    (RunTimeScale(), (torch.randn(1, 3, 6, 6), torch.randn(1, 8, 1, 1)), "_check_per_channel"),
], ids=["per_pixel_scale", "run_time_scale"])
def test_near_misses_stay_unfused_name_their_check_and_still_match(model, inputs, check):
    hist = _export_and_compare(model, *inputs)
    assert hist.get("MUL") == 1, hist
    report = circle_fx.explain(model, inputs)
    assert any(m.kind == "conv_batch_norm" and m.check == check for m in report), report.format()


def test_convolution_used_elsewhere_is_not_folded():
    hist = _export_and_compare(ConvUsedTwice(), torch.randn(1, 3, 6, 6))
    assert hist.get("MUL") == 1 and hist.get("CONV_2D") == 1, hist


def test_batch_norm_without_a_convolution_is_one_mul_and_one_add():
    hist = _export_and_compare(BNFirst(), torch.randn(1, 3, 6, 6))
    assert hist.get("MUL") == 1 and hist.get("ADD") == 1 and "SUB" not in hist and "RSQRT" not in hist, hist


@settings(max_examples=15, deadline=None)
@given(dims=st.sampled_from([1, 2]), c_in=st.integers(1, 4), mult=st.integers(1, 3), k=st.integers(1, 4),
       stride=st.integers(1, 2), depthwise=st.booleans(), bias=st.booleans(), affine=st.booleans(),
       size=st.integers(4, 8), seed=st.integers(0, 100))
def test_fused_graph_equals_the_unfused_model(dims, c_in, mult, k, stride, depthwise, bias, affine, size, seed):
    groups = c_in if depthwise else 1
    model = ConvBN(dims, c_in, c_in * mult, k, stride, groups, bias, affine, padding=k // 2, seed=seed)
    x = torch.randn(2, c_in, *([size] * dims), generator=torch.Generator().manual_seed(seed))
    p = circle_fx.capture(model, (x,))
    run_passes(p, default_pipeline())
    run_passes(p, finalize_pipeline())
    targets = {str(n.target) for n in p.gm.graph.nodes if n.op == "call_function"}
    assert not targets & {"aten.mul.Tensor", "aten.add.Tensor", "aten.batch_norm.default"}, targets
    from circle_fx.fusions.conv_batch_norm import RULES
    # the ReLU after it fuses too, and that record absorbs this family's (its rules are listed)
    assert any(rule in {r.name for r in RULES} for rec in p.fusions() for rule in rec.rules)
    torch.testing.assert_close(p.run(x)[0], model(x), rtol=1e-4, atol=1e-5)


def test_transformers_resnet_folds_every_batch_norm():
    """transformers' ResNet exports its BatchNorms as ``_native_batch_norm_legit_no_training``
    (a tuple read by getitem): they fold too, and the ReLUs fuse into the convolutions."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.ResNetForImageClassification(transformers.ResNetConfig(
        hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], embedding_size=8)).eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            _randomize(m, torch.Generator().manual_seed(1))
    x = torch.randn(1, 3, 32, 32)
    cm = circle_fx.export(model, (x,), example_kwargs={"return_dict": False})
    hist = cm.op_histogram()
    assert "MUL" not in hist and "SUB" not in hist and hist["TRANSPOSE"] == 1, hist
    np.testing.assert_allclose(cm.run(x)[0], model(x, return_dict=False)[0].detach().numpy(), rtol=1e-4, atol=1e-4)
