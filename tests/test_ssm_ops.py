"""Ops that the state-space / hybrid transformers families (Mamba, Mamba-2, Jamba, Zamba...)
produce in their slow (pure torch) paths, each checked in onert against eager.

- ``weight @ x`` with a constant lhs (Mamba's ``dt_proj.weight @ time_step``): onert 0.1.0
  refuses a constant BATCH_MATMUL lhs, so it is computed as ``(x^T @ weight^T)^T``.
"""
from __future__ import annotations

import pytest
import torch

from onert_eager import assert_onert_matches_eager

TOL = dict(rtol=1e-5, atol=1e-5)


class ConstLhs(torch.nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(*shape, generator=torch.Generator().manual_seed(3)))

    def forward(self, x):
        return self.weight @ x.transpose(1, 2)


@pytest.mark.parametrize("shape", [(12, 5), (2, 12, 5)], ids=["2d", "3d"])
def test_matmul_with_constant_lhs(shape):
    x = torch.randn(2, 7, 5, generator=torch.Generator().manual_seed(4))
    cm = assert_onert_matches_eager(ConstLhs(shape), (x,), **TOL)
    assert cm.op_histogram()["BATCH_MATMUL"] == 1
