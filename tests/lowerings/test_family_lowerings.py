"""Op-level checks for the lowerings the model families needed (Phi3, T5, GPT-OSS):
split/chunk, topk, max/min over a dim, clamp, single-tensor indexing, repeat_interleave.
Each tiny module is exported, run in onert and compared with torch eager."""
from __future__ import annotations

import pytest
import torch

import circle_fx

from onert_eager import Fn, assert_onert_matches_eager


def _check(module, *inputs, atol=1e-6):
    return assert_onert_matches_eager(module, inputs, rtol=1e-6, atol=atol)


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("sizes,dim", [([6, 10], -1), ([3, 5], 1), ([1, 1, 14], 2), (5, 2)])
def test_split(sizes, dim):
    cm = _check(Fn(lambda x: tuple(t * (i + 1) for i, t in enumerate(x.split(sizes, dim)))), _randn(2, 8, 16))
    assert "SPLIT_V" not in cm.op_histogram()  # onert's SPLIT_V returns zeros


@pytest.mark.parametrize("chunks", [2, 3])
def test_chunk_uneven_last_piece(chunks):
    _check(Fn(lambda x: tuple(t + i for i, t in enumerate(x.chunk(chunks, dim=-1)))), _randn(1, 4, 10))


@pytest.mark.parametrize("op", [torch.max, torch.min])
@pytest.mark.parametrize("keepdim", [True, False])
def test_max_min_dim(op, keepdim):
    _check(Fn(lambda x: tuple(op(x, dim=-1, keepdim=keepdim))), _randn(2, 3, 7))


def test_max_dim_values_only_emits_no_argmax():
    cm = _check(Fn(lambda x: x - x.max(dim=-1, keepdim=True).values), _randn(2, 3, 7))
    assert "ARG_MAX" not in cm.op_histogram()


@pytest.mark.parametrize("lo,hi", [(None, 0.5), (-0.5, 0.5), (-0.2, None)])
def test_clamp(lo, hi):
    cm = _check(Fn(lambda x: x.clamp(min=lo, max=hi)), _randn(4, 6))
    hist = cm.op_histogram()
    assert hist["MAXIMUM"] == (lo is not None) and hist["MINIMUM"] == (hi is not None)


def test_index_with_one_tensor_gathers():
    w = _randn(4, 6, 5, seed=2)
    idx = torch.tensor([3, 0, 0, 2, 1], dtype=torch.int64)
    cm = _check(Fn(lambda i: w[i] * 2), idx)
    assert cm.op_histogram()["GATHER"] == 1
    _check(Fn(lambda x, i: x[:, i]), _randn(3, 6), torch.tensor([5, 1, 1], dtype=torch.int64))


def test_index_with_two_tensors_is_one_flat_gather():
    """Was reported as unsupported (GATHER_ND); now rewritten by passes/flat_index.py."""
    rows, cols = torch.tensor([0, 1]), torch.tensor([1, 2])
    _check(Fn(lambda x: x[rows.clone(), cols.clone()] + x[0, 0]), _randn(3, 4))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_repeat_interleave(dim):
    _check(Fn(lambda x: x.repeat_interleave(3, dim=dim)), _randn(4, 5))
