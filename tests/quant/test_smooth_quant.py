"""SmoothQuant (``circle_fx.quant.smooth``): the scales fold into constants exactly.

Property (hypothesis): for every RMSNorm spelling the fusion accepts (``rms_cases``: square /
reduction / inverse spellings, eps placement, weight none / before / after / inside / on the
scale / Gemma's ``1 + w``, the cast styles), followed by a group of linears and a gated MLP
(``down(silu(gate(y)) * up(y))``), folding *random* per-channel scales ``s`` (0.05 .. 20) into
the fused graph leaves the float model's outputs unchanged (float32, 1e-4 relative), adds no
op, and finds exactly the norm's group and the down_proj group.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circle_fx
from circle_fx.errors import InputError
from circle_fx.quant.smooth import (apply_scales, calibrate_maxima, fuse_rms_norms, smooth_groups, smooth_quant)
from rms_cases import NormModule, spellings

FUZZ = settings(max_examples=8, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class NormThenLinears(torch.nn.Module):
    """``norm(x)`` read by ``n_lin`` linears and a gated MLP (``down(silu(gate) * up)``)."""

    def __init__(self, sp, d, n_lin=2, bias=True, pre="none", seed=0, gated=True):
        super().__init__()
        self.gated = gated
        torch.manual_seed(seed)
        self.norm = NormModule(sp, d, pre=pre, seed=seed)
        self.lins = torch.nn.ModuleList(torch.nn.Linear(d, d + i, bias=bias) for i in range(n_lin))
        self.gate, self.up = torch.nn.Linear(d, 2 * d, bias=False), torch.nn.Linear(d, 2 * d, bias=bias)
        self.down = torch.nn.Linear(2 * d, d)

    def forward(self, x):
        y = self.norm(x)
        outs = tuple(lin(y) for lin in self.lins)
        if not self.gated:
            return outs
        return (self.down(torch.nn.functional.silu(self.gate(y)) * self.up(y)), *outs)


def _fused(model, x):
    gm = torch.export.export(model.eval(), (x,), strict=False).module()
    fuse_rms_norms(gm)
    return gm


def _ops(gm):
    return sorted(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def _close(got, want):
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4 * float(w.abs().max()))


CASES = dict(sp=spellings, d=st.integers(2, 24), lead=st.lists(st.integers(1, 4), min_size=0, max_size=2),
             n_lin=st.integers(1, 3), bias=st.booleans(), pre=st.sampled_from(["none", "affine", "linear"]),
             seed=st.integers(0, 2 ** 16), log_range=st.floats(0.0, 3.0))


@FUZZ
@given(**CASES)
def test_random_scales_fold_exactly_for_every_spelling(sp, d, lead, n_lin, bias, pre, seed, log_range):
    _check_random_scales(sp, d, lead, n_lin, bias, pre, seed, log_range)


@pytest.mark.slow
@settings(FUZZ, max_examples=60)
@given(**CASES)
def test_many_random_scales_fold_exactly(sp, d, lead, n_lin, bias, pre, seed, log_range):
    _check_random_scales(sp, d, lead, n_lin, bias, pre, seed, log_range)


def _check_random_scales(sp, d, lead, n_lin, bias, pre, seed, log_range):
    model = NormThenLinears(sp, d, n_lin, bias, pre, seed)
    x = torch.randn(*lead, 3, d, generator=torch.Generator().manual_seed(seed))
    gm = _fused(model, x)
    with torch.no_grad():
        want = model(x)
    before = _ops(gm)
    groups = smooth_groups(gm)
    assert sorted(g.kind for g in groups) == ["rms_norm", "up_proj"], gm.graph
    norm_group = next(g for g in groups if g.kind == "rms_norm")
    assert len(norm_group.linears) == n_lin + 2
    g = torch.Generator().manual_seed(seed + 1)
    for group in groups:
        s = torch.exp((torch.rand(group.width, generator=g) * 2 - 1) * log_range)
        apply_scales(gm, group, s)
    gm.recompile()
    after = _ops(gm)
    assert after == before, (before, after)
    with torch.no_grad():
        got = gm(x)
    _close(got, want)


def test_alpha_one_makes_every_channel_max_one():
    """alpha = 1: s_j = max|X_j|, so the smoothed norm output's per-channel maxima are all 1;
    alpha = 0: s_j = 1/max|W_j| over the group, so the smoothed weights' column maxima are 1
    (no gated MLP here: its up_proj rows would be rescaled afterwards)."""
    from rms_cases import Spelling

    model = NormThenLinears(Spelling(weight="gemma"), 8, gated=False)
    cal = [(torch.randn(2, 5, 8) * torch.linspace(0.1, 30, 8),) for _ in range(3)]
    for alpha in (1.0, 0.0):
        gm = torch.export.export(model.eval(), cal[0], strict=False).module()
        groups = smooth_quant(gm, cal, alpha)
        norm = next(g for g in groups if g.kind == "rms_norm")
        if alpha == 1.0:
            m = calibrate_maxima(gm, [norm.source], cal)[norm.source]
            torch.testing.assert_close(m, torch.ones_like(m), rtol=1e-5, atol=1e-5)
        else:
            cols = torch.stack([_attr(gm, lin.args[1].target).abs().amax(0)
                                for lin in norm.linears]).amax(0)
            torch.testing.assert_close(cols, torch.ones_like(cols), rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            _close(gm(cal[0][0]), model(cal[0][0]))


def _attr(gm, target):
    from circle_fx.program import fetch_attr

    return fetch_attr(gm, target)


class Shared(torch.nn.Module):
    """A norm output also read by a non-linear (residual), and a weight tied to an embedding:
    neither can be smoothed without a new op."""

    def __init__(self, d=8):
        super().__init__()
        self.emb = torch.nn.Embedding(16, d)
        self.w = torch.nn.Parameter(torch.rand(d) + 0.5)
        self.w2 = torch.nn.Parameter(torch.rand(d) + 0.5)
        self.fc = torch.nn.Linear(d, d)
        self.head = torch.nn.Linear(d, 16, bias=False)
        self.head.weight = self.emb.weight

    def _norm(self, x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    def forward(self, ids):
        x = self.emb(ids)
        y = self._norm(x, self.w)
        x = x + self.fc(y) + y
        return self.head(self._norm(x, self.w2))


def test_unfoldable_groups_are_left_alone():
    model, ids = Shared(), torch.randint(0, 16, (1, 6))
    gm = torch.export.export(model.eval(), (ids,), strict=False).module()
    assert smooth_quant(gm, [(ids,)], 0.5) == []


def test_quantizer_option_end_to_end_in_onert(tiny_llama):
    """``CircleQuantizer(smooth_quant=0.5, calibration=...)``: the norms' groups and the gated
    MLPs are smoothed, the float graph is unchanged, and the onert file matches its
    fake-quant reference as the unsmoothed one does (tests/quant/test_pt2e_llama.py)."""
    from pt2e_util import output_scale, quantize_pt2e, read

    from circle_fx.quant import CircleQuantizer

    model, (ids,) = tiny_llama
    g = torch.Generator().manual_seed(1)
    cal = [(torch.randint(0, model.config.vocab_size, ids.shape, generator=g),) for _ in range(3)]
    q = CircleQuantizer(skip=(), smooth_quant=0.5, calibration=cal)
    converted = quantize_pt2e(model, (ids,), cal, q)
    layers = model.config.num_hidden_layers
    assert sorted(gr.kind for gr in q.smoothed).count("up_proj") == layers
    assert sorted(gr.kind for gr in q.smoothed).count("v_proj") == layers
    assert sorted(gr.kind for gr in q.smoothed).count("rms_norm") == 2 * layers + (0 if model.config.tie_word_embeddings else 1)
    cm = circle_fx.export(converted, (ids,), quant_target="onert")
    (logits,) = cm.run(ids)
    ref = converted(ids)
    ref = (ref.logits if hasattr(ref, "logits") else ref[0] if isinstance(ref, (tuple, list)) else ref).detach().numpy()
    assert np.abs(logits - ref).max() / output_scale(read(cm)) <= 4.0


def test_option_needs_calibration():
    from circle_fx.quant import CircleQuantizer

    with pytest.raises(InputError, match="calibration"):
        CircleQuantizer(smooth_quant=0.5)
    with pytest.raises(InputError, match="alpha"):
        smooth_quant(torch.export.export(Shared(), (torch.zeros(1, 2, dtype=torch.long),)).module(), [()], 1.5)
