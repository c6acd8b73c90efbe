"""The RoPE fusion family: HF ``q*cos + rotate_half(q)*sin`` -> Circle ROPE, only where onert is exact."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import circle_fx
from circle_fx.fusions import get_family


class Rotate(torch.nn.Module):
    """HF's own apply_rotary_pos_emb on BHSD q/k with cos/sin computed from positions."""

    def __init__(self, positions, dim=16):
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        freqs = torch.outer(torch.tensor(positions, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos()[None])  # [1, S, D]
        self.register_buffer("sin", emb.sin()[None])

    def forward(self, q, k):
        return apply_rotary_pos_emb(q, k, self.cos * 1.0, self.sin * 1.0)


def test_one_position_fuses_and_matches_eager_in_onert():
    m = Rotate([37])
    q, k = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 1, 16)
    cm = circle_fx.export(m, (q, k))
    assert cm.op_histogram()["ROPE"] == 2
    assert [f.kind for f in cm.report.fusions] == ["rope", "rope"]
    want = m(q, k)
    got = cm.run(q, k)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), atol=1e-6)


def test_several_positions_stay_decomposed():
    """onert's ROPE applies table row 0 to every position: fusing this would be wrong."""
    m = Rotate([0, 1, 2, 3])
    q, k = torch.randn(1, 4, 4, 16), torch.randn(1, 2, 4, 16)
    cm = circle_fx.export(m, (q, k))
    assert cm.op_histogram()["ROPE"] == 0
    for g, w in zip(cm.run(q, k), m(q, k)):
        np.testing.assert_allclose(g, w.numpy(), atol=1e-5)


def test_family_is_registered_and_removable():
    rope = get_family("rope")
    assert rope.op is torch.ops.circle.rope.default and rope.pass_name == "fuse_rope"
    assert "fuse_rope" in circle_fx.default_pipeline().names()
    m = Rotate([5])
    inputs = (torch.randn(1, 4, 1, 16), torch.randn(1, 2, 1, 16))
    cm = circle_fx.export(m, inputs, passes=circle_fx.default_pipeline().remove_pass("fuse_rope"))
    assert cm.op_histogram()["ROPE"] == 0


def test_circle_rope_with_several_positions_runs_decomposed():
    """Called directly (the fusion never does this), circle.rope with a table of several
    positions would be silently wrong in onert's ROPE: the ``rope_positions`` legalization step
    decomposes it (emit/legalize/forms.py; tests/lowerings/test_form_limits.py), tables given
    as model inputs too."""
    from circle_fx.fusions.rope import rope
    from onert_eager import assert_onert_matches_eager

    class Direct(torch.nn.Module):
        def forward(self, x, s, c):
            return rope(x, s, c)

    g = torch.Generator().manual_seed(0)
    x, s, c = torch.randn(1, 2, 3, 8, generator=g), torch.randn(1, 1, 3, 8, generator=g), torch.randn(1, 1, 3, 8, generator=g)
    cm = assert_onert_matches_eager(Direct(), (x, s, c), rtol=1e-5, atol=1e-5)
    assert cm.op_histogram()["ROPE"] == 0
