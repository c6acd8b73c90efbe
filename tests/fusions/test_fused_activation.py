"""The fused-activation family: ReLU / ReLU6 after a convolution becomes the convolution's own
``fused_activation_function`` (CONV_2D / DEPTHWISE_CONV_2D).

Spellings fuse (no RELU / MAXIMUM / MINIMUM left) and match eager in onert; onert's fused
form equals, bit for bit, the same file with the activation as a separate operator; other
clamps stay unfused, name their check and still match; a hypothesis test checks that the
fused graph computes what the unfused model does.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import circle_fx
from circle_fx.passes import default_pipeline, finalize_pipeline, run_passes

ACTS = {
    "relu": torch.relu, "relu6": F.relu6, "hardtanh": lambda y: F.hardtanh(y, 0.0, 6.0),
    "clamp06": lambda y: torch.clamp(y, 0, 6), "clamp_min0": lambda y: torch.clamp(y, min=0),
    "clamp04": lambda y: torch.clamp(y, 0, 4), "clamp_pm1": lambda y: torch.clamp(y, -1, 1),
}


class ConvAct(torch.nn.Module):
    def __init__(self, act="relu", dims=2, c_in=3, c_out=8, groups=1, k=3, stride=1, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        conv = torch.nn.Conv2d if dims == 2 else torch.nn.Conv1d
        self.conv = conv(c_in, c_out, k, stride=stride, padding=k // 2, groups=groups)
        with torch.no_grad():
            self.conv.weight.mul_(4)
        self.act = ACTS[act]

    def forward(self, x):
        return self.act(self.conv(x))


def _export(model, x, fuse=True):
    passes = default_pipeline()
    if not fuse:
        passes.remove_pass("fuse_fused_activation")
    return circle_fx.export(model, (x,), passes=passes)


@pytest.mark.parametrize("act", ["relu", "relu6", "hardtanh", "clamp06", "clamp_min0"])
@pytest.mark.parametrize("dims,groups", [(2, 1), (2, 3), (1, 1)], ids=["conv2d", "depthwise", "conv1d"])
def test_spellings_fuse_and_equal_the_unfused_file_in_onert(act, dims, groups):
    x = torch.randn(1, 3, *([7] * dims)) * 2
    model = ConvAct(act, dims, c_in=3, c_out=6, groups=groups)
    fused, plain = _export(model, x), _export(model, x, fuse=False)
    hist = fused.op_histogram()
    assert not {"RELU", "MAXIMUM", "MINIMUM"} & set(hist), hist
    got = fused.run(x)[0]
    np.testing.assert_array_equal(got, plain.run(x)[0])  # onert's fused activation is exact
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act", ["clamp04", "clamp_pm1"])
def test_other_clamps_stay_unfused_name_their_check_and_still_match(act):
    x = torch.randn(1, 3, 6, 6) * 2
    model = ConvAct(act)
    cm = _export(model, x)
    assert cm.op_histogram().get("MINIMUM") == 1
    np.testing.assert_allclose(cm.run(x)[0], model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    report = circle_fx.explain(model, (x,))
    assert any(m.kind == "fused_activation" and m.check == "_check_bounds" for m in report), report.format()


@settings(max_examples=12, deadline=None)
@given(act=st.sampled_from(sorted(ACTS)), dims=st.sampled_from([1, 2]), c_in=st.integers(1, 3),
       depthwise=st.booleans(), k=st.integers(1, 3), stride=st.integers(1, 2), seed=st.integers(0, 50))
def test_fused_graph_equals_the_unfused_model(act, dims, c_in, depthwise, k, stride, seed):
    model = ConvAct(act, dims, c_in, 2 * c_in, c_in if depthwise else 1, k, stride, seed)
    x = torch.randn(1, c_in, *([6] * dims), generator=torch.Generator().manual_seed(seed)) * 2
    p = circle_fx.capture(model, (x,))
    run_passes(p, default_pipeline())
    run_passes(p, finalize_pipeline())
    fused = [r.kind for r in p.fusions()].count("fused_activation")
    assert fused == (act not in ("clamp04", "clamp_pm1"))
    torch.testing.assert_close(p.run(x)[0], model(x), rtol=1e-5, atol=1e-5)
