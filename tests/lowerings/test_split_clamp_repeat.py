"""split / chunk (SPLIT for equal pieces, SLICEs otherwise: onert's SPLIT_V returns zeros),
clamp (MAXIMUM / MINIMUM only for the bounds given) and repeat_interleave: each tiny module is
exported, run in onert and compared with torch eager."""
from __future__ import annotations

import pytest
import torch

import circle_fx

from onert_eager import Fn, assert_onert_matches_eager, randn


def _check(module, *inputs, atol=1e-6):
    return assert_onert_matches_eager(module, inputs, rtol=1e-6, atol=atol)



@pytest.mark.parametrize("sizes,dim", [([6, 10], -1), ([3, 5], 1), ([1, 1, 14], 2), (5, 2)])
def test_split(sizes, dim):
    cm = _check(Fn(lambda x: tuple(t * (i + 1) for i, t in enumerate(x.split(sizes, dim)))), randn(2, 8, 16))
    assert "SPLIT_V" not in cm.op_histogram()  # onert's SPLIT_V returns zeros


@pytest.mark.parametrize("chunks", [2, 3])
def test_chunk_uneven_last_piece(chunks):
    _check(Fn(lambda x: tuple(t + i for i, t in enumerate(x.chunk(chunks, dim=-1)))), randn(1, 4, 10))


@pytest.mark.parametrize("lo,hi", [(None, 0.5), (-0.5, 0.5), (-0.2, None)])
def test_clamp(lo, hi):
    cm = _check(Fn(lambda x: x.clamp(min=lo, max=hi)), randn(4, 6))
    hist = cm.op_histogram()
    assert hist["MAXIMUM"] == (lo is not None) and hist["MINIMUM"] == (hi is not None)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_repeat_interleave(dim):
    _check(Fn(lambda x: x.repeat_interleave(3, dim=dim)), randn(4, 5))
