"""Ops that the state-space / hybrid transformers families (Mamba, Mamba-2, Jamba, Zamba...)
produce in their slow (pure torch) paths, each checked in onert against eager.

- decompositions (einsum -> bmm) of permuted, sliced inputs (Mamba-2's multi-chunk scan);
- 5-D reductions (xLSTM's chunked ``[b, heads, chunks, l, l]``): onert takes rank <= 4, so
  neighbouring dims are merged first.

Their matrix products (a constant lhs, rank 5) are in ``test_matmul.py``.
"""
from __future__ import annotations

import pytest
import torch

from onert_eager import Fn, assert_onert_matches_eager

TOL = dict(rtol=1e-5, atol=1e-5)


class ChunkedEinsum(torch.nn.Module):
    """Mamba-2's chunked scan: ``einsum("bclhn,bchpn->bclhp", C, states)`` where ``states``
    is a slice of a permuted tensor (not contiguous)."""

    def forward(self, c, s):
        s = s.permute(1, 2, 0, 3, 4)[:, :-1]  # [heads, 1, chunks+1, p, n] -> [1, chunks, heads, p, n]
        return torch.einsum("bclhn,bchpn->bclhp", c, s)


def test_decomposition_of_a_non_contiguous_input():
    """A decomposition traced on contiguous examples ``view``s what is, in the graph, a
    permuted tensor: it must be traced with the inputs' own strides."""
    gen = torch.Generator().manual_seed(5)
    c, s = torch.randn(1, 2, 4, 8, 8, generator=gen), torch.randn(8, 1, 3, 16, 8, generator=gen)
    assert_onert_matches_eager(ChunkedEinsum(), (c, s), **TOL)


X5 = torch.randn(1, 3, 2, 4, 4, generator=torch.Generator().manual_seed(6))


@pytest.mark.parametrize("fn", [
    lambda x: x.amax(-1),
    lambda x: x.sum(-1, keepdim=True),
    lambda x: x.mean((1, 2)),
    lambda x: x.sum((3, 4)),
], ids=["amax_last", "sum_keepdim", "mean_middle", "sum_last_two"])
def test_reduction_of_a_5d_tensor(fn):
    """xLSTM's chunked [b, heads, chunks, l, l] reductions: onert reduces rank <= 4 only
    ("ShapeValidator failed at line 304"), so neighbouring dims are merged first."""
    assert_onert_matches_eager(Fn(fn), (X5,), **TOL)


def test_reduction_axes_that_alternate_still_fold():
    """Reduced and kept dims alternate 5 times: the size-1 dim drops out (4 runs, one SUM);
    this was a clear error before (tests/lowerings/test_high_rank_ops.py covers 5 runs: TRANSPOSE first)."""
    cm = assert_onert_matches_eager(Fn(lambda x: x.sum((0, 2, 4))), (X5,), **TOL)
    assert cm.op_histogram()["SUM"] == 1
