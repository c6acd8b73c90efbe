"""Grouped-query attention without copying K/V: the ``GroupedQueryAttention`` pass (HF's
``repeat_kv`` before SDPA -> ``enable_gqa``) and the grouped SDPA lowering, in onert."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import repeat_kv

import circle_fx
from circle_fx.passes.gqa import GroupedQueryAttention


class RepeatThenSdpa(torch.nn.Module):
    def forward(self, q, k, v, mask):
        rep = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), attn_mask=mask)


class EnableGqa(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def _inputs(L, S, heads=6, kv=2, mask_kind="bool"):
    torch.manual_seed(0)
    q, k, v = torch.randn(1, heads, L, 8), torch.randn(1, kv, S, 8), torch.randn(1, kv, S, 8)
    visible = torch.rand(1, 1, L, S) > 0.3
    visible[..., 0] = True
    mask = visible if mask_kind == "bool" else torch.where(visible, 0.0, -1e9)
    return q, k, v, mask


@pytest.mark.parametrize("L, S, mask_kind", [(1, 17, "bool"), (5, 5, "bool"), (3, 9, "float")])
def test_repeat_kv_becomes_grouped_and_matches_eager(L, S, mask_kind):
    inputs = _inputs(L, S, mask_kind=mask_kind)
    pipe = circle_fx.default_pipeline()
    pipe.insert_after("fuse_rms_norm", GroupedQueryAttention())
    cm = circle_fx.export(RepeatThenSdpa(), inputs, passes=pipe)
    ops = cm.op_histogram()
    assert ops["BROADCAST_TO"] == 0 and ops["TRANSPOSE"] == 0 and ops["BATCH_MATMUL"] == 2
    (got,) = cm.run(*inputs)
    np.testing.assert_allclose(got, RepeatThenSdpa()(*inputs).numpy(), atol=1e-5)
    # without the pass, K and V are still copied to every head (BROADCAST_TO or GATHER), same numbers
    plain = circle_fx.export(RepeatThenSdpa(), inputs)
    ops = plain.op_histogram()
    assert ops["BROADCAST_TO"] + ops["GATHER"] == 2
    np.testing.assert_allclose(plain.run(*inputs)[0], RepeatThenSdpa()(*inputs).numpy(), atol=1e-5)


def test_enable_gqa_lowers_grouped():
    inputs = _inputs(4, 7)
    cm = circle_fx.export(EnableGqa(), inputs)
    assert cm.op_histogram()["BROADCAST_TO"] == 0
    (got,) = cm.run(*inputs)
    np.testing.assert_allclose(got, EnableGqa()(*inputs).numpy(), atol=1e-5)
