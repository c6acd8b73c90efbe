"""``A @ B`` with a constant ``A``: onert 0.1.0 refuses a constant BATCH_MATMUL lhs at load
("OperationValidator failed at line 123"), so ``_matmul.batch_matmul`` (the one place that
emits BATCH_MATMUL) computes ``(B^T @ A^T)^T``, whichever lowering calls it and whatever the
ranks, 1-D operands included. Each case runs in onert against eager."""
from __future__ import annotations

import pytest
import torch

from onert_eager import Fn, assert_onert_matches_eager

G = torch.Generator().manual_seed(0)
W = torch.randn(4, 5, generator=G)
V = torch.randn(5, generator=G)
W5 = torch.randn(2, 1, 3, 4, 5, generator=G)
TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, fn, shape", [
    ("matrix @ vector", lambda v: W @ v, (5,)),
    ("matrix @ batched", lambda x: torch.matmul(W, x), (2, 3, 5, 6)),
    ("vector @ batched", lambda x: V @ x, (2, 5, 3)),
    ("5-D @ 4-D", lambda x: W5 @ x, (2, 3, 5, 6)),
    ("5-D @ vector", lambda x: W5 @ x, (5,)),
    ("linear of a constant input", lambda w: torch.nn.functional.linear(W, w), (3, 5)),
])
def test_constant_lhs_matmul_runs(name, fn, shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    cm = assert_onert_matches_eager(Fn(fn), [x], **TOL)
    assert cm.op_histogram()["BATCH_MATMUL"] == 1


def test_constant_lhs_matmul_with_a_dynamic_batch_runs():
    from torch.export import Dim
    x = torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(1))
    assert_onert_matches_eager(Fn(lambda x: W @ x), [x], **TOL, dynamic_shapes=(({0: Dim("b", max=8)},),))
