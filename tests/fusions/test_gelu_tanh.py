"""The GELU-tanh family: hand-written tanh-approximation GELUs become one Circle GELU.

Spellings it claims fuse and run in onert against eager; near misses (another coefficient,
another scale, the formula on two different tensors) stay decomposed and still run; a
hypothesis test draws shapes and coefficients and checks that exactly the right ones fuse.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import circle_fx

K = math.sqrt(2.0 / math.pi)


class Gelu(torch.nn.Module):
    """``gelu_new`` with its constants as parameters (defaults: the real formula)."""

    def __init__(self, half=0.5, k=K, c=0.044715, power=3.0):
        super().__init__()
        self.half, self.k, self.c, self.power = half, k, c, power

    def forward(self, x):
        return self.half * x * (1.0 + torch.tanh(self.k * (x + self.c * torch.pow(x, self.power))))


class GeluFast(torch.nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


class GeluHalfLast(torch.nn.Module):
    def forward(self, x):
        return x * (1.0 + torch.tanh(K * (x + 0.044715 * x ** 3))) * 0.5


class GeluInMlp(torch.nn.Module):
    """GPT-2's MLP: c_fc -> gelu_new -> c_proj."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc, self.proj = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16)

    def forward(self, x):
        return self.proj(Gelu()(self.fc(x)))


class TwoTensors(torch.nn.Module):
    """The formula with ``y`` in the cubic term: not a GELU of anything."""

    def forward(self, x, y):
        return 0.5 * x * (1.0 + torch.tanh(K * (x + 0.044715 * torch.pow(y, 3.0))))


def _export_and_compare(model, *inputs):
    cm = circle_fx.export(model, inputs)
    got = cm.run(*inputs)[0]
    np.testing.assert_allclose(got, model(*inputs).detach().numpy(), rtol=1e-5, atol=2e-6)
    return dict(cm.op_histogram())


@pytest.mark.parametrize("model", [Gelu(), GeluFast(), GeluHalfLast()], ids=["gelu_new", "gelu_fast", "half_last"])
def test_spellings_fuse_to_one_gelu_and_match_eager_in_onert(model):
    x = torch.randn(2, 7, 32) * 3
    assert _export_and_compare(model, x) == {"GELU": 1}


def test_gpt2_mlp_gets_one_gelu():
    hist = _export_and_compare(GeluInMlp(), torch.randn(1, 5, 16))
    assert hist.get("GELU") == 1 and "TANH" not in hist and "POW" not in hist


@pytest.mark.parametrize("model,why", [
    (Gelu(c=0.05), "cubic coefficient"),
    (Gelu(k=0.8), "scale"),
    (Gelu(half=0.6), "half"),
    (Gelu(power=2.0), "pattern: pow(x, 2) canonicalizes away from the cubic"),
], ids=["coefficient", "scale", "half", "square"])
def test_near_misses_stay_decomposed_and_still_match(model, why):
    hist = _export_and_compare(model, torch.randn(2, 9) * 2)
    assert "GELU" not in hist and hist.get("TANH") == 1, why


def test_formula_on_two_tensors_is_not_fused():
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    assert "GELU" not in _export_and_compare(TwoTensors(), x, y)


def test_near_miss_names_the_refusing_check():
    from circle_fx.fusions.gelu_tanh import RULES
    from circle_fx.passes import Canonicalize, DeadCodeElimination, FoldConstants, decompose_passes, run_passes
    from circle_fx.patterns.rewrite import try_rewrite

    p = circle_fx.capture(Gelu(c=0.05), (torch.randn(2, 4),))
    run_passes(p, [*decompose_passes(), Canonicalize(), FoldConstants(), DeadCodeElimination()])
    root = [n for n in p.gm.graph.nodes if n.op == "call_function"][-1]
    failure = try_rewrite(next(r for r in RULES if r.name == "gelu_new"), root)
    assert not failure and failure.check == "_check_constants" and "0.044715" in str(failure.why)


@pytest.mark.parametrize("model,check,words", [
    (Gelu(c=0.05), "_check_constants", "cubic coefficient 0.05 != 0.044715"),
    (Gelu(half=0.4), "_check_constants", "half 0.4 != 0.5"),
], ids=["coefficient", "half"])
def test_explain_reports_the_near_miss_by_its_check(model, check, words):
    """``explain`` names the refusing check and the model line, as for RMSNorm."""
    result = circle_fx.explain(model, (torch.randn(2, 5, 16),))
    (entry,) = result.entries
    assert entry.kind == "gelu_tanh" and entry.check == check and words in entry.reason, result.format()
    assert "test_gelu_tanh.py" in entry.source


def test_explain_is_silent_on_a_lone_tanh_and_on_a_fused_gelu():
    """``tanh`` alone (soft-capping) is no missed GELU: only a refused check is reported."""
    class SoftCap(torch.nn.Module):
        def forward(self, x):
            return torch.tanh(x / 30.0) * 30.0

    for model in (SoftCap(), Gelu()):
        assert not circle_fx.explain(model, (torch.randn(2, 5, 16),)).entries


@settings(max_examples=12, deadline=None)
@given(shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       c=st.sampled_from([0.044715, 0.044715 * (1 + 1e-8), 0.04, 0.05]),
       k=st.sampled_from([K, 0.7978845608, 0.79, 1.0]),
       scale=st.floats(0.5, 6.0))
def test_fuses_exactly_the_formula(shape, c, k, scale):
    x = torch.randn(*shape) * scale
    model = Gelu(k=k, c=c)
    hist = _export_and_compare(model, x)
    right = math.isclose(c, 0.044715, rel_tol=1e-6) and math.isclose(k, K, rel_tol=1e-6)
    assert ("GELU" in hist) == right, (c, k, hist)
