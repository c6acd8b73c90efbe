"""Activation importance (``circle_fx.quant.activation_importance``) and Q4_0 scales weighted by it.

The importance of a linear's input column is the mean of ``x^2`` over calibration samples; with it
the Q4_0 block scales minimise ``sum imp_j (w_j - q_j d)^2``, the part of the rounding error that
reaches ``W x``. Checked: the statistics against a hand computation (tied weights found under
every name), the weighted search against the plain one block by block, and a model whose input
has a few loud columns (what a trained LLM's residual stream has) exported, run in onert and
compared with eager: weighted scales must be closer than unweighted ones.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import circle_fx
from circle_fx import InputError, QuantConfig
from circle_fx.circle import ggml
from circle_fx.circle.ggml_support import ggml_unsupported_reason
from circle_fx.quant import Importance, activation_importance
from circle_fx.quant.ggml import pack


class TwoLinears(nn.Module):
    """An input with loud columns into two linears; ``head`` shares ``emb``'s table (tied)."""

    def __init__(self, d=64, hidden=128, vocab=96):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight
        gain = torch.ones(d)
        gain[[3, 17, 40]] = 30.0  # outlier channels
        self.register_buffer("gain", gain)

    def forward(self, ids):
        h = self.emb(ids) * self.gain
        return self.head(h + self.down(torch.relu(self.up(h))))


def _model():
    torch.manual_seed(0)
    return TwoLinears().eval()


def _samples(n=3, length=24, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 96, (1, length), generator=g) for _ in range(n)]


def test_importance_is_the_mean_square_of_each_input_column():
    model, samples = _model(), _samples()
    imp = activation_importance(model, samples)
    with torch.no_grad():
        h = torch.cat([(model.emb(s) * model.gain).reshape(-1, 64) for s in samples])
        u = torch.relu(model.up(h))
        r = h + model.down(u)
    np.testing.assert_allclose(imp["up"], (h * h).mean(0).numpy(), rtol=1e-5)
    np.testing.assert_allclose(imp["down"], (u * u).mean(0).numpy(), rtol=1e-5)
    # the tied table: under the module, its own parameter name and the embedding's
    for key in ("head", "head.weight", "emb.weight"):
        np.testing.assert_allclose(imp[key], (r * r).mean(0).numpy(), rtol=1e-5)
    assert imp.samples == 3 and imp.rows == 72
    assert np.array_equal(imp.for_weight("up.weight", 64), imp["up"])
    assert np.array_equal(imp.for_weight("x.weight+up.weight", 64), imp["up"])  # a merged weight: any member
    assert imp.for_weight("nothing.weight", 64) is None
    with pytest.raises(InputError, match=r"importance\['up.weight'\] has 64 values but weight 'up.weight' has 32"):
        imp.for_weight("up.weight", 32)
    assert not any(m._forward_pre_hooks for m in model.modules())  # hooks removed


def test_importance_errors_name_the_cause():
    model = _model()
    with pytest.raises(InputError, match="no samples"):
        activation_importance(model, [])
    with pytest.raises(InputError, match="failed on sample 1: IndexError"):
        activation_importance(model, [torch.zeros(1, 3, dtype=torch.long), torch.full((1, 3), 1000)])
    assert not any(m._forward_pre_hooks for m in model.modules())  # removed after a failure too
    with pytest.raises(InputError, match="has no torch.nn.Linear"):
        activation_importance(nn.ReLU(), [torch.zeros(3)])
    with pytest.raises(InputError, match="must be a torch.nn.Module"):
        activation_importance(lambda x: x, [torch.zeros(3)])
    with pytest.raises(InputError, match=r"importance\['a'\]: values must be finite and >= 0"):
        QuantConfig(weights="q4_0", importance={"a": [1.0, -1.0]})
    with pytest.raises(InputError, match=r"one value per input column \(1-D\)"):
        QuantConfig(weights="q4_0", importance={"a": np.ones((2, 2))})
    with pytest.raises(InputError, match="QuantConfig\\(importance=...\\): expected"):
        QuantConfig(weights="q4_0", importance=[1.0, 2.0])
    cfg = QuantConfig(weights="q4_0", importance={"a": [1.0, 2.0]})
    assert isinstance(cfg.importance, Importance) and hash(cfg)  # stays hashable


def _weighted_err(blocks, w, imp):
    r = ggml.dequantize(ggml.Q4_0, blocks.numpy(), w.shape) - w
    return ((r * r) * imp[None, :]).reshape(-1, 32).sum(-1)


def test_weighted_search_lowers_the_weighted_error():
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((128, 256)) * 0.05).astype(np.float32)
    imp = np.ones(256, np.float32)
    imp[rng.choice(256, 8, replace=False)] = 400.0  # a few loud input columns
    plain, _, _ = pack(torch.from_numpy(w), ggml.Q4_0, search=False)
    unweighted, _, _ = pack(torch.from_numpy(w), ggml.Q4_0)
    weighted, e_plain, e_chosen = pack(torch.from_numpy(w), ggml.Q4_0, importance=imp)
    e_p, e_u, e_w = (_weighted_err(b, w, imp) for b in (plain, unweighted, weighted))
    assert (e_w <= e_p * (1 + 1e-6)).all()  # never worse than ggml's scale, block by block
    assert e_p.sum() == pytest.approx(e_plain, rel=1e-4) and e_w.sum() == pytest.approx(e_chosen, rel=1e-4)
    assert e_w.sum() < 0.75 * e_u.sum(), (e_w.sum(), e_u.sum())  # measured: about half
    # uniform importance is the plain search's objective: no worse than it
    flat, _, _ = pack(torch.from_numpy(w), ggml.Q4_0, importance=np.full(256, 3.0, np.float32))
    assert _weighted_err(flat, w, np.ones(256)).sum() <= _weighted_err(unweighted, w, np.ones(256)).sum() * 1.001
    with pytest.raises(ValueError, match=r"importance has shape \(64,\), expected \(256,\)"):
        pack(torch.from_numpy(w), ggml.Q4_0, importance=np.ones(64))


def test_importance_weighted_q4_0_model_is_closer_to_eager_in_onert():
    model = _model()
    ids = _samples(1, 32, seed=7)[0]
    with torch.no_grad():
        ref = model(ids).numpy()
    imp = activation_importance(model, _samples())
    plain = circle_fx.export(model, (ids,), quantize=QuantConfig(weights="q4_0", embedding="q4_0", lm_head="q4_0"))
    weighted = circle_fx.export(model, (ids,), quantize=QuantConfig(weights="q4_0", embedding="q4_0", lm_head="q4_0",
                                                                    importance=imp))
    text = weighted.summary()
    assert "q4_0 scales weighted by activation importance: 3 weight(s)" in text, text
    assert "(importance-weighted)" in text
    assert weighted.size == plain.size  # the same encoding, other scales
    if ggml_unsupported_reason():
        pytest.skip(ggml_unsupported_reason())
    err = lambda cm: float(np.linalg.norm(cm.run(ids)[0] - ref) / np.linalg.norm(ref))
    e_plain, e_weighted = err(plain), err(weighted)
    assert e_weighted < 0.85 * e_plain, (e_weighted, e_plain)


def test_linears_without_importance_get_the_plain_search_and_are_listed():
    model = _model()
    ids = _samples(1, 16)[0]
    imp = {"up": activation_importance(model, _samples())["up"]}
    cm = circle_fx.export(model, (ids,), quantize=QuantConfig(weights="q4_0", embedding="q4_0", lm_head="q4_0",
                                                                    importance=imp))
    text = cm.summary()
    assert "weighted by activation importance: 1 weight(s), calibrated on values given to QuantConfig" in text, text
    assert "; none given for 2 (plain search): " in text, text
    assert "down" in text.split("none given for")[1]
    wrong = {"up": np.ones(32, np.float32)}
    with pytest.raises(InputError, match="has 32 values but weight 'up.weight' has 64 input columns"):
        circle_fx.export(model, (ids,), quantize=QuantConfig(weights="q4_0", importance=wrong))
