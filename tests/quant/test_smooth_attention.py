"""SmoothQuant's v_proj -> o_proj fold (``circle_fx/quant/smooth_rules.py``): attention is linear
in V, so v_proj's output rows take ``1/s`` and o_proj's input columns ``s`` -- per v_proj channel,
which with GQA several o_proj columns (one per query head of the group) share.

Property (hypothesis): a Llama-like block (RMSNorm -> q/k/v -> attention -> o_proj, gated MLP)
in every attention spelling the rules claim (SDPA after HF's ``repeat_kv``, SDPA with
``enable_gqa``, ``matmul`` eager attention), MHA and GQA, with or without biases: folding random
scales into every group found leaves the float model's outputs unchanged, and the channel map
sends o_proj column (head h, dim d) to v channel (h // group, d). Near misses: layouts that mix
positions and channels are refused by check ``channel_map``, a shared o_proj weight by
``weights_private``, and ``explain`` reports them.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circle_fx
from circle_fx.quant.smooth import apply_scales, fuse_rms_norms, smooth_candidates

FUZZ = settings(max_examples=6, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
F = torch.nn.functional


class Block(torch.nn.Module):
    """One pre-norm decoder block; ``spelling``: "repeat_sdpa", "gqa_sdpa", "matmul", or the
    near misses "scrambled_v" (v's [T, C] reshaped as [C, T] and transposed) and
    "heads_not_transposed" (the head merge reshapes [B, H, T, D] without the transpose)."""

    def __init__(self, heads=4, kv_heads=2, head_dim=4, bias=False, spelling="repeat_sdpa", seed=0, tied_o=False):
        super().__init__()
        torch.manual_seed(seed)
        d = heads * head_dim
        self.h, self.kv, self.hd, self.spelling = heads, kv_heads, head_dim, spelling
        self.norm_w = torch.nn.Parameter(torch.rand(d) + 0.5)
        self.q = torch.nn.Linear(d, d, bias=bias)
        self.k = torch.nn.Linear(d, kv_heads * head_dim, bias=bias)
        self.v = torch.nn.Linear(d, kv_heads * head_dim, bias=bias)
        self.o = torch.nn.Linear(d, d, bias=bias)
        self.o2 = torch.nn.Linear(d, d, bias=False)
        if tied_o:
            self.o2.weight = self.o.weight
        self.tied_o = tied_o

    def _repeat(self, x):
        b, kv, t, hd = x.shape
        g = self.h // kv
        return x[:, :, None].expand(b, kv, g, t, hd).reshape(b, kv * g, t, hd)

    def forward(self, x):
        b, t, d = x.shape
        y = self.norm_w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        q = self.q(y).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k(y).view(b, t, self.kv, self.hd).transpose(1, 2)
        if self.spelling == "scrambled_v":
            v = self.v(y).reshape(b, self.kv * self.hd, t).transpose(1, 2).reshape(b, t, self.kv, self.hd).transpose(1, 2)
        else:
            v = self.v(y).view(b, t, self.kv, self.hd).transpose(1, 2)
        if self.spelling == "gqa_sdpa":
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        elif self.spelling == "bmm":  # the attention on [B*H, T, D] (GPT-J/-NeoX-era eager code)
            k, v = self._repeat(k), self._repeat(v)
            p = torch.softmax(q @ k.transpose(2, 3) * self.hd ** -0.5, -1)
            a = torch.bmm(p.reshape(b * self.h, t, t), v.reshape(b * self.h, t, self.hd)).reshape(b, self.h, t, self.hd)
        elif self.spelling == "v_as_query":  # near miss: q and k are V too, so scaling V moves the weights
            v = self._repeat(v)
            a = F.scaled_dot_product_attention(v, v, v)
        elif self.spelling == "matmul":
            k, v = self._repeat(k), self._repeat(v)
            mask = torch.full((t, t), float("-inf")).triu(1)
            a = torch.matmul(torch.softmax(q @ k.transpose(2, 3) * self.hd ** -0.5 + mask, -1), v)
        else:
            a = F.scaled_dot_product_attention(q, self._repeat(k), self._repeat(v), is_causal=True)
        if self.spelling == "heads_not_transposed":
            a = a.reshape(b, t, d)
        else:
            a = a.transpose(1, 2).reshape(b, t, d)
        out = x + self.o(a)
        return out + self.o2(out) if self.tied_o else out


def _fused(model, x):
    gm = torch.export.export(model.eval(), (x,), strict=False).module()
    fuse_rms_norms(gm)
    return gm


def _check(heads, kv, head_dim, bias, spelling, seed, t, log_range):
    model = Block(heads, kv, head_dim, bias, spelling, seed)
    x = torch.randn(2, t, heads * head_dim, generator=torch.Generator().manual_seed(seed))
    gm = _fused(model, x)
    with torch.no_grad():
        want = model(x)
    groups, skipped = smooth_candidates(gm)
    assert [g.kind for g in groups] == ["rms_norm", "v_proj"] and not skipped, (groups, skipped)
    v = groups[1]
    assert v.width == kv * head_dim
    col = torch.arange(heads * head_dim)
    assert torch.equal(v.channels, (col // head_dim) // (heads // kv) * head_dim + col % head_dim)
    g = torch.Generator().manual_seed(seed + 1)
    for group in groups:
        apply_scales(gm, group, torch.exp((torch.rand(group.width, generator=g) * 2 - 1) * log_range))
    gm.recompile()
    with torch.no_grad():
        got = gm(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


CASES = dict(kv=st.integers(1, 2), group=st.integers(1, 3), head_dim=st.sampled_from([2, 4, 8]), bias=st.booleans(),
             spelling=st.sampled_from(["repeat_sdpa", "gqa_sdpa", "matmul", "bmm"]), seed=st.integers(0, 2 ** 16),
             t=st.integers(1, 5), log_range=st.floats(0.5, 3.0))  # 0 would make every scale 1


@FUZZ
@given(**CASES)
def test_random_scales_fold_exactly_through_attention(kv, group, head_dim, bias, spelling, seed, t, log_range):
    _check(kv * group, kv, head_dim, bias, spelling, seed, t, log_range)


@pytest.mark.slow
@settings(FUZZ, max_examples=40)
@given(**CASES)
def test_many_random_scales_fold_exactly_through_attention(kv, group, head_dim, bias, spelling, seed, t, log_range):
    _check(kv * group, kv, head_dim, bias, spelling, seed, t, log_range)


@pytest.mark.parametrize("spelling", ["scrambled_v", "heads_not_transposed"])
def test_layouts_that_mix_positions_are_refused(spelling):
    model, x = Block(spelling=spelling), torch.randn(1, 3, 16)
    groups, skipped = smooth_candidates(_fused(model, x))
    assert [g.kind for g in groups] == ["rms_norm"]
    assert [(s.kind, s.check) for s in skipped] == [("v_proj", "channel_map")], skipped
    assert "position" in skipped[0].reason


def test_value_also_used_as_query_is_refused():
    """``sdpa(v, v, v)``: the channel map alone would accept it (o_proj's columns do read V's
    channels), but scaling v_proj moves q and k as well: check ``value_path_only`` refuses it,
    and folding what is found keeps the model exact."""
    model, x = Block(heads=2, kv_heads=2, spelling="v_as_query"), torch.randn(1, 3, 8)
    gm = _fused(model, x)
    groups, skipped = smooth_candidates(gm)
    assert [(s.kind, s.check) for s in skipped] == [("v_proj", "value_path_only")], skipped
    assert "q depends on v_proj" in skipped[0].reason


def test_dynamic_length_is_skipped_not_an_error():
    """A dynamic sequence length: the channel labels need static shapes, so the v_proj
    candidate is skipped with the reason (``explain`` still works, as ``export`` does)."""
    model, x = Block(), torch.randn(1, 3, 16)
    t = torch.export.Dim("t", min=2, max=64)
    gm = torch.export.export(model.eval(), (x,), dynamic_shapes=({1: t},), strict=False).module()
    fuse_rms_norms(gm)
    groups, skipped = smooth_candidates(gm)
    assert [g.kind for g in groups] == ["rms_norm"]
    assert [(s.kind, s.check) for s in skipped] == [("v_proj", "channel_map")] and "dynamic" in skipped[0].reason
    text = circle_fx.explain(model, (x,), dynamic_shapes=({1: t},)).format()
    assert "channel_map" in text


def test_shared_o_proj_weight_is_refused_and_explained():
    model, x = Block(tied_o=True), torch.randn(1, 3, 16)
    groups, skipped = smooth_candidates(_fused(model, x))
    assert "v_proj" not in [g.kind for g in groups]
    assert [(s.kind, s.check) for s in skipped] == [("v_proj", "weights_private")], skipped
    text = circle_fx.explain(model, (x,)).format()
    assert "SmoothQuant folds" in text and "check:  weights_private" in text and "v_proj candidate" in text


def test_tiny_llama_smooths_v_proj_exactly(tiny_llama):
    """The HF GQA Llama (4 query heads over 2 kv heads): every layer's v_proj group is found
    and random scales in every group leave the logits unchanged."""
    model, (ids,) = tiny_llama
    gm = _fused(model, ids)
    with torch.no_grad():
        want = gm(ids)
    groups, _ = smooth_candidates(gm)
    assert sum(g.kind == "v_proj" for g in groups) == model.config.num_hidden_layers
    g = torch.Generator().manual_seed(0)
    for group in groups:
        apply_scales(gm, group, torch.exp(torch.randn(group.width, generator=g)))
    gm.recompile()
    with torch.no_grad():
        got = gm(ids)
    got, want = (o.logits if hasattr(o, "logits") else o[0] for o in (got, want))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
