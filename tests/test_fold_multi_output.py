"""Constant folding of ops with several results (``passes/fold_constants.py``).

Gemma3n's activation sparsity builds ``torch.distributions.Normal(0, 1)`` in its forward:
``broadcast_tensors`` of two constants, which has no lowering and needs none, since only
``getitem`` reads it and every input is a constant. It must fold (each item read becoming
a constant) instead of failing the export as an unsupported op.
"""
from __future__ import annotations

import torch

from onert_eager import Fn, assert_onert_matches_eager


def _gaussian_topk(x):
    """Gemma3n's ``_gaussian_topk``: keep what lies above mean + std * Phi^-1(0.95)."""
    std_multiplier = torch.distributions.normal.Normal(0, 1).icdf(torch.tensor(0.95))
    cutoff = x.mean(-1, keepdim=True) + x.std(-1, keepdim=True, unbiased=False) * std_multiplier
    return torch.relu(x - cutoff)


class SplitConstant(torch.nn.Module):
    """``split`` of a buffer: a multi-result op on a constant, read item by item."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.linspace(-1, 1, 12).reshape(3, 4))

    def forward(self, x):
        a, b, c = torch.split(self.table, 1, dim=0)
        return x * a + b - c


def test_broadcast_tensors_of_constants_folds():
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    assert_onert_matches_eager(Fn(_gaussian_topk), [x], rtol=1e-5, atol=1e-5)
    assert (_gaussian_topk(x) > 0).any() and (_gaussian_topk(x) == 0).any()  # the cutoff matters


def test_split_of_a_constant_folds_to_constants():
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    cm = assert_onert_matches_eager(SplitConstant(), [x], rtol=1e-6, atol=1e-6)
    assert "SPLIT" not in cm.op_histogram() and "SPLIT_V" not in cm.op_histogram()
