"""Indexing (``x[i]``, ``x[:, i]``, ``x[rows, cols]``) in onert against eager: one GATHER per
index, two index tensors as one GATHER on the flattened tensor; negative indices, where
GATHER reads out of bounds while torch counts from the end: constant index tensors are
wrapped at compile time, run-time ones with ``idx + size * (idx < 0)`` (the same model then
runs with other indices).
"""
from __future__ import annotations

import pytest
import torch

from onert_eager import Fn, assert_onert_matches_eager, randn

TOL = dict(rtol=1e-6, atol=1e-6)
X2 = torch.randn(3, 7, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("index", [[-1, 0, -3], [2, -7, 6]], ids=["rows", "cols"])
def test_negative_constant_indices(index):
    idx = torch.tensor(index)
    fn = (lambda x: x[idx] * 1) if max(abs(i) for i in index) <= 3 else (lambda x: x[:, idx] * 1)
    assert_onert_matches_eager(Fn(fn), (X2,), **TOL)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
def test_negative_runtime_indices(dtype):
    idx = torch.tensor([-1, 0, -7, 6], dtype=dtype)
    cm = assert_onert_matches_eager(Fn(lambda x, i: x[:, i]), (X2, idx), **TOL)
    # the same model with other (non-negative, then negative) indices at run time
    for other in ([0, 1, 2, 3], [-2, -3, -4, -5]):
        i = torch.tensor(other, dtype=dtype)
        assert torch.equal(torch.as_tensor(cm.run(X2, i)[0]), X2[:, i])


def test_index_with_one_tensor_gathers():
    w = randn(4, 6, 5, seed=2)
    idx = torch.tensor([3, 0, 0, 2, 1], dtype=torch.int64)
    cm = _check(Fn(lambda i: w[i] * 2), idx)
    assert cm.op_histogram()["GATHER"] == 1
    _check(Fn(lambda x, i: x[:, i]), randn(3, 6), torch.tensor([5, 1, 1], dtype=torch.int64))


def test_index_with_two_tensors_is_one_flat_gather():
    """Two index tensors: one GATHER on the flattened tensor (passes/flat_index.py), no GATHER_ND."""
    rows, cols = torch.tensor([0, 1]), torch.tensor([1, 2])
    _check(Fn(lambda x: x[rows.clone(), cols.clone()] + x[0, 0]), randn(3, 4))


def _check(module, *inputs):
    return assert_onert_matches_eager(module, inputs, rtol=1e-6, atol=1e-6)

