"""``matmul`` / ``bmm`` (the one place that emits BATCH_MATMUL: ``emit/lowerings/_matmul.py``)
in the forms onert 0.1.0 takes, each run in onert against eager:

- a constant lhs: onert refuses a constant BATCH_MATMUL lhs at load ("OperationValidator
  failed at line 123"), so ``A @ B`` is computed as ``(B^T @ A^T)^T``, whatever the ranks,
  1-D operands and a dynamic batch included (Mamba's ``dt_proj.weight @ time_step``);
- any rank: onert takes operands of rank 2..4; the ``ranks`` legalization step folds the batch
  dims by how they broadcast (linear attention's ``[B, H, chunks, C, C]`` products), and a
  rank-4 product is left as it is;
- the peephole feeds a transposed operand to BATCH_MATMUL's ``adjointRhs`` (no TRANSPOSE).

The folds themselves, on the operator list, are in ``test_legalize.py``; ``matmul`` and ``bmm``
also have their row in ``test_every_lowering.py``.
"""
from __future__ import annotations

import zlib

import pytest
import torch

from onert_eager import Fn, assert_onert_matches_eager

TOL = dict(rtol=1e-5, atol=1e-5)


def r(*shape):
    """Seeded from the shape: the tables below are built at import, so the global RNG would
    make their values depend on what ran before."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(zlib.crc32(f"randn{shape}".encode())))


W, V, W5, Q = r(4, 5), r(5), r(2, 1, 3, 4, 5), r(8)


@pytest.mark.parametrize("name, fn, shape", [
    ("matrix @ vector", lambda v: W @ v, (5,)),
    ("matrix @ batched", lambda x: torch.matmul(W, x), (2, 3, 5, 6)),
    ("vector @ batched", lambda x: V @ x, (2, 5, 3)),
    ("5-D @ 4-D", lambda x: W5 @ x, (2, 3, 5, 6)),
    ("5-D @ vector", lambda x: W5 @ x, (5,)),
    ("linear of a constant input", lambda w: torch.nn.functional.linear(W, w), (3, 5)),
    # Inkling2's learned query against transposed keys
    ("expanded query @ transposed", lambda x: torch.matmul(Q.view(-1, 8).expand(1, 2, 1, 8), x.transpose(-1, -2)),
     (1, 2, 3, 8)),
])
def test_constant_lhs_matmul_runs(name, fn, shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    cm = assert_onert_matches_eager(Fn(fn), [x], **TOL)
    assert cm.op_histogram()["BATCH_MATMUL"] == 1


def test_constant_lhs_matmul_with_a_dynamic_batch_runs():
    from torch.export import Dim
    x = torch.randn(3, 5, 6, generator=torch.Generator().manual_seed(1))
    assert_onert_matches_eager(Fn(lambda x: W @ x), [x], **TOL, dynamic_shapes=(({0: Dim("b", max=8)},),))


class ConstLhs(torch.nn.Module):
    """Mamba's ``dt_proj.weight @ time_step``: a parameter lhs, a transposed (non-contiguous) rhs."""

    def __init__(self, shape):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(*shape, generator=torch.Generator().manual_seed(3)))

    def forward(self, x):
        return self.weight @ x.transpose(1, 2)


@pytest.mark.parametrize("shape", [(12, 5), (2, 12, 5)], ids=["2d", "3d"])
def test_parameter_lhs_of_a_transposed_rhs(shape):
    x = torch.randn(2, 7, 5, generator=torch.Generator().manual_seed(4))
    cm = assert_onert_matches_eager(ConstLhs(shape), (x,), **TOL)
    assert cm.op_histogram()["BATCH_MATMUL"] == 1


MATMULS = {
    # the delta rule's k @ k^T and attn @ v: [B, H, chunks, C, D]
    "rank5": (r(1, 4, 2, 8, 6), r(1, 4, 2, 6, 8)),
    "rank5_lhs_broadcasts": (r(1, 4, 1, 8, 6), r(2, 4, 3, 6, 5)),
    "rank5_both_broadcast": (r(2, 1, 3, 8, 6), r(1, 4, 3, 6, 5)),
    "rank5_x_rank2": (r(2, 2, 3, 4, 5), r(5, 6)),
    "rank5_x_rank3": (r(2, 2, 3, 4, 5), r(3, 5, 6)),
    # 1s alternating between the operands: three broadcast runs, expanded first
    "three_runs": (r(2, 1, 3, 4, 5), r(1, 4, 1, 5, 6)),
    "rank6": (r(2, 3, 1, 4, 5, 6), r(1, 3, 2, 4, 6, 2)),
    "vector_lhs": (r(5), r(2, 2, 3, 5, 6)),
    "vector_rhs": (r(2, 2, 3, 4, 5), r(5)),
    "vector_x_matrix": (r(5), r(5, 6)),
}


@pytest.mark.parametrize("name", list(MATMULS))
def test_matmul_any_rank_matches_eager(name):
    a, b = MATMULS[name]
    cm = assert_onert_matches_eager(Fn(torch.matmul), (a, b), **TOL)
    assert cm.op_histogram()["BATCH_MATMUL"] == 1


def test_rank4_matmul_is_unchanged():
    """Within onert's ranks nothing is folded: one BATCH_MATMUL, no RESHAPE."""
    cm = assert_onert_matches_eager(Fn(torch.matmul), (r(2, 1, 4, 5), r(1, 3, 5, 6)), **TOL)
    assert dict(cm.op_histogram()) == {"BATCH_MATMUL": 1}


def test_peephole_feeds_transposed_operand_to_batch_matmul_directly():
    """``q @ k.transpose(-1, -2)`` needs no TRANSPOSE: BATCH_MATMUL's adjointRhs does it."""
    mod = Fn(lambda q, k: torch.softmax(q @ k.transpose(-1, -2), -1))
    q, k = r(1, 2, 5, 8), r(1, 2, 6, 8)
    cm = assert_onert_matches_eager(mod, (q, k), rtol=0, atol=1e-6)
    assert cm.op_histogram()["TRANSPOSE"] == 0 and cm.op_histogram()["BATCH_MATMUL"] == 1
