"""``scaled_dot_product_attention`` with static shapes, in onert vs eager: each mask kind
and the grouped-query head repeat (the dynamic-length cases are in test_dynamic_shapes)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import circle_fx
from onert_eager import assert_onert_matches_eager

B, HQ, HKV, L, S, E = 2, 4, 2, 5, 5, 8


def qkv(hk=HKV):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, HQ, L, E, generator=g), torch.randn(B, hk, S, E, generator=g),
            torch.randn(B, hk, S, E, generator=g))


class Attn(torch.nn.Module):
    def __init__(self, causal=False, const_mask=None):
        super().__init__()
        self.causal = causal
        if const_mask is not None:
            self.register_buffer("mask", const_mask)
        else:
            self.mask = None

    def forward(self, q, k, v, *mask):
        m = mask[0] if mask else self.mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=self.causal,
                                              enable_gqa=k.shape[1] != q.shape[1])


def ops(cm) -> dict:
    return circle_fx.verify(cm).op_counts


def test_gqa_repeat_and_causal_mask():
    cm = assert_onert_matches_eager(Attn(causal=True), qkv(), rtol=1e-4, atol=1e-5)
    counts = ops(cm)
    assert counts["GATHER"] == 2  # K and V heads repeated 2x
    assert counts["SELECT_V2"] == 0


def test_no_repeat_when_heads_match():
    cm = assert_onert_matches_eager(Attn(), qkv(hk=HQ), rtol=1e-4, atol=1e-5)
    assert ops(cm)["GATHER"] == 0


def test_constant_bool_mask_becomes_additive():
    mask = torch.rand(L, S, generator=torch.Generator().manual_seed(1)) > 0.3
    mask[:, 0] = True  # every row attends somewhere (an all-masked row is NaN in both)
    cm = assert_onert_matches_eager(Attn(const_mask=mask), qkv(), rtol=1e-4, atol=1e-5)
    assert ops(cm)["SELECT_V2"] == 0


def test_runtime_bool_mask_selects():
    mask = torch.rand(B, 1, L, S, generator=torch.Generator().manual_seed(2)) > 0.3
    mask[..., 0] = True
    cm = assert_onert_matches_eager(Attn(), (*qkv(), mask), rtol=1e-4, atol=1e-5)
    assert ops(cm)["SELECT_V2"] == 1


@pytest.mark.parametrize("const", [False, True])
def test_float_mask_is_added(const):
    mask = torch.randn(L, S, generator=torch.Generator().manual_seed(3))
    module, inputs = (Attn(const_mask=mask), qkv()) if const else (Attn(), (*qkv(), mask))
    cm = assert_onert_matches_eager(module, inputs, rtol=1e-4, atol=1e-5)
    assert ops(cm)["SELECT_V2"] == 0



class ConstantQueries(torch.nn.Module):
    """DETR's decoder: learned queries attend to the encoder's keys and values. The query side
    depends on no input, so folding makes ``q`` a constant, which onert 0.1.0 refuses as a
    BATCH_MATMUL lhs ("OperationValidator failed at line 123"): the product is emitted as
    ``(K q^T)^T``. Also the grouped-head form (4 query heads on 2 key/value heads)."""

    def __init__(self, heads):
        super().__init__()
        self.q = torch.nn.Parameter(torch.randn(1, heads, L, E, generator=torch.Generator().manual_seed(3)))

    def forward(self, k, v):
        q = self.q.expand(k.shape[0], -1, -1, -1) * 0.5  # an op on the constant: folded
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] != q.shape[1])


@pytest.mark.parametrize("heads", [HKV, HQ], ids=["same_heads", "grouped"])
def test_constant_queries(heads):
    _, k, v = qkv()
    assert_onert_matches_eager(ConstantQueries(heads), (k, v), rtol=1e-4, atol=1e-5)


def test_attention_of_constants_is_folded():
    """Attention over constants only (DETR's first decoder self-attention: zero queries plus
    learned positions) is evaluated at compile time: its op is seeded (dropout), but with
    ``dropout_p == 0`` it is deterministic and folding takes it."""
    q, k, v = qkv(hk=HQ)

    class Fixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("q", q[:1].clone())
            self.register_buffer("k", k[:1].clone())

        def forward(self, x):
            return F.scaled_dot_product_attention(self.q, self.k, self.k * 2) + x

    cm = assert_onert_matches_eager(Fixed(), (v[:1],), rtol=1e-4, atol=1e-5)
    assert "BATCH_MATMUL" not in ops(cm) and "SOFTMAX" not in ops(cm), ops(cm)
