"""``torch.topk`` in onert (it has no TOPK_V2 kernel: circle_fx lowers it through REDUCE_MAX
rounds), against eager: values and indices, the MoE router use, rank 5, rows with fewer
finite values than k, and no index wrapping for its (never negative) positions; and
``max.dim`` / ``min.dim`` (REDUCE_MAX + ARG_MAX) on 4-D inputs; ``argmax`` / ``argmin``
(decomposed into the index output of ``max.dim`` / ``min.dim``), ties included.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import circle_fx
from onert_eager import Fn, assert_onert_matches_eager, randn

INF = float("inf")


def _check(module, *inputs, atol=1e-6):
    return assert_onert_matches_eager(module, inputs, rtol=1e-6, atol=atol)



@pytest.mark.parametrize("k,largest", [(1, True), (2, True), (3, True), (2, False)])
def test_topk_values_and_indices(k, largest):
    cm = _check(Fn(lambda x: torch.topk(x, k, dim=-1, largest=largest)), randn(8, 5))
    assert "TOPK_V2" not in cm.op_histogram()  # not implemented by onert 0.1.0


def test_topk_router_pattern():
    """GPT-OSS's router: softmax over the top-k logits, indices used to pick experts."""
    w = randn(4, 6, 3, seed=1)

    def router(x):
        v, i = torch.topk(x, 2, dim=-1)
        return torch.softmax(v, dim=1), w[i.reshape(-1)]
    _check(Fn(router), randn(8, 4))


@pytest.mark.parametrize("largest", [True, False])
def test_rank5_topk_matches_eager(largest):
    """topk's REDUCE_MAX goes through the reduction fold (reduce_into), as max_dim's does:
    a 5-D REDUCE_MAX fails onert's prepare ("ShapeValidator failed at line 304")."""
    cm = assert_onert_matches_eager(Fn(lambda x: torch.topk(x, 2, -1, largest=largest)), (randn(1, 2, 3, 4, 5),),
                                    rtol=0, atol=0)
    assert cm.op_histogram()["REDUCE_MAX"] == 2


def test_topk_rows_with_fewer_finite_values_than_k_give_distinct_indices():
    """Rows masked with -inf (DeepSeek-V4's indexer scores): the values match eager and the
    indices are k distinct positions holding them (torch orders tied -inf positions as it
    likes, so the tied indices themselves are not compared). Before: [0.5, -inf] gave [0, 0]."""
    mask = torch.tensor([[False, True, False, True], [True, True, True, False], [True, True, True, True]])
    x = randn(3, 4).masked_fill(mask, -INF)
    cm = circle_fx.export(Fn(lambda x: torch.topk(x, 3, dim=-1)), (x,))
    values, indices = cm.run(x)
    expected = torch.topk(x, 3, dim=-1).values.numpy()
    np.testing.assert_array_equal(values, expected)
    for r in range(3):
        assert len(set(indices[r].tolist())) == 3, indices
        np.testing.assert_array_equal(x.numpy()[r][indices[r]], expected[r])


def test_topk_indices_need_no_wrap():
    """Positions from topk are never negative: no extra ops for the MoE router case."""
    model = Fn(lambda x: x[:, torch.topk(x[0], 2).indices] * 1)
    cm = assert_onert_matches_eager(model, (randn(3, 7, seed=1),), rtol=1e-6, atol=1e-6)
    assert "LESS" not in cm.op_histogram()


X4 = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("fn", [
    lambda x: x.max(dim=1).values + 0,
    lambda x: x.min(dim=2)[0] * 1,
    lambda x: x.max(dim=1).indices,
    lambda x: x.min(dim=-2, keepdim=True)[0] * 2,
], ids=["max_values", "min_values", "max_indices", "min_keepdim"])
def test_max_min_dim_on_4d(fn):
    """4-D REDUCE_MAX / ARG_MAX: the reduction keeps its dims (the ranks legalization step)."""
    assert_onert_matches_eager(Fn(fn), (X4,), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", [torch.max, torch.min])
@pytest.mark.parametrize("keepdim", [True, False])
def test_max_min_dim(op, keepdim):
    _check(Fn(lambda x: tuple(op(x, dim=-1, keepdim=keepdim))), randn(2, 3, 7))


def test_max_dim_values_only_emits_no_argmax():
    cm = _check(Fn(lambda x: x - x.max(dim=-1, keepdim=True).values), randn(2, 3, 7))
    assert "ARG_MAX" not in cm.op_histogram()


@pytest.mark.parametrize("fn", [torch.argmax, torch.argmin])
@pytest.mark.parametrize("dim,keepdim", [(None, False), (None, True), (-1, False), (1, True), (0, False)])
def test_argmax_argmin_match_eager(fn, dim, keepdim):
    cm = _check(Fn(lambda x: fn(x, dim=dim, keepdim=keepdim)), randn(3, 4, 5))
    assert "ARG_MAX" in cm.op_histogram()


@pytest.mark.parametrize("fn", [torch.argmax, torch.argmin])
def test_argmax_argmin_pick_the_first_of_tied_values(fn):
    """Greedy decoding's argmax over tied logits: torch returns the first index, and so must onert."""
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [0.0, -1.0, 5.0, -1.0]])
    cm = circle_fx.export(Fn(lambda x: fn(x, -1)), (x,))
    np.testing.assert_array_equal(cm.run(x)[0], fn(x, -1).numpy())


def test_argmax_of_int32_values_matches_eager():
    x = torch.randint(-5, 5, (4, 7), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    _check(Fn(lambda x: torch.argmax(x, -1)), x)
