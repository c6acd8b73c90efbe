"""Ops above the ranks onert 0.1.0 runs, folded into ranks it does (circle_fx/circle/limits.py).

Linear-attention and xLSTM models (chunked delta rules: Qwen3-Next, Kimi-Linear, OLMo-hybrid...)
multiply, reduce and mask ``[B, H, chunks, C, C]`` tensors. onert 0.1.0 refuses BATCH_MATMUL
and reductions at rank 5, and computes SELECT_V2 with a broadcasting operand wrongly at rank
5 (no error). Each case runs in onert against eager (the matrix products: ``test_matmul.py``); the verify cases show that an operator
beyond a limit is reported instead of written silently.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.circle.schema import BO
from circle_fx.emit.builder import ModelBuilder
from circle_fx.emit.lowerings._common import options
from circle_fx.emit.writer import serialize

from onert_eager import Fn, assert_onert_matches_eager

TOL = dict(rtol=1e-5, atol=1e-5)


def _gen(shape, salt: str) -> torch.Generator:
    """A generator seeded from the shape: the tables below are built at import, so the
    global RNG would make their values depend on what ran before (and differ between runs)."""
    return torch.Generator().manual_seed(zlib.crc32(f"{salt}{tuple(shape)}".encode()))


def r(*shape):
    return torch.randn(*shape, generator=_gen(shape, "randn"))


def mask(*shape):
    return torch.rand(*shape, generator=_gen(shape, "mask")) > 0.5


X5 = r(1, 3, 2, 4, 4)  # xLSTM's chunked [b, heads, chunks, l, l]: a size-1 dim that folds into any run

REDUCTIONS = {
    "delta_rule_sum": (lambda x: (x[..., 0, :5].unsqueeze(-1) * x).sum(-2), r(2, 3, 4, 5, 6)),
    "sum_keepdim": (lambda x: x.sum(-2, keepdim=True), r(2, 3, 4, 5, 6)),
    "mean_alternating": (lambda x: x.mean((1, 3)), r(2, 3, 4, 5, 6)),  # kept/reduced alternate 5 times: TRANSPOSE
    "amax": (lambda x: x.amax((0, 2, 4)), r(2, 3, 4, 5, 6)),
    "sum_all": (lambda x: x.sum(), r(2, 3, 4, 5, 6)),
    "amax_last": (lambda x: x.amax(-1), X5),
    "mean_middle": (lambda x: x.mean((1, 2)), X5),
    "sum_last_two": (lambda x: x.sum((3, 4)), X5),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_rank5_reductions_match_eager(name):
    fn, x = REDUCTIONS[name]
    assert_onert_matches_eager(Fn(fn), (x,), rtol=1e-4, atol=1e-4)


def test_reduction_runs_skip_a_size1_dim():
    """Reduced and kept dims alternate 5 times, but the size-1 dim drops out: 4 runs, one SUM
    and no TRANSPOSE (5 runs: ``mean_alternating``)."""
    cm = assert_onert_matches_eager(Fn(lambda x: x.sum((0, 2, 4))), (X5,), rtol=1e-5, atol=1e-5)
    assert cm.op_histogram()["SUM"] == 1 and "TRANSPOSE" not in cm.op_histogram()


WHERES = {
    # silently wrong in onert 0.1.0 before folding (max abs diff 2.2 .. 3.4)
    "mask_lower_rank": (lambda k, x: torch.where(k, x, 0.0), (mask(5, 4), r(2, 1, 3, 5, 4))),
    "masked_fill": (lambda k, x: x.masked_fill(k, -1.0), (mask(3, 5, 1), r(2, 1, 3, 5, 4))),
    "value_broadcasts": (lambda k, x, y: torch.where(k, x, y),
                         (mask(2, 1, 3, 5, 4), r(3, 5, 1), r(2, 1, 3, 5, 4))),
    "rank6": (lambda k, x: torch.where(k, x, 0.0), (mask(3, 1, 4), r(2, 2, 1, 3, 5, 4))),
}


@pytest.mark.parametrize("name", list(WHERES))
def test_high_rank_select_with_broadcasting_matches_eager(name):
    torch.manual_seed(0)
    fn, inputs = WHERES[name]
    assert_onert_matches_eager(Fn(fn), inputs, rtol=0, atol=0)


def test_rank6_slice_select_and_expand_match_eager():
    torch.manual_seed(0)

    def fn(x):
        return x[:, :, 1:5:2] * 2, x.select(3, 2) + 1, x[:, :, :, :1].expand(2, 3, 6, 7, 2, 3) - 1

    assert_onert_matches_eager(Fn(fn), (r(2, 3, 6, 4, 2, 3),), rtol=0, atol=0)


# ------------------------------------------------------------------ verify reports the limits
def _one_op(code, in_shapes, out_shape, consts=(), out_type=0):
    mb = ModelBuilder()
    ins = []
    for i, s in enumerate(in_shapes):
        t = mb.add_tensor(f"in{i}", s, 0 if i or code != BO.SELECT_V2 else 6)  # FLOAT32 (BOOL cond)
        mb.inputs.append(t)
        mb.input_names.append(f"in{i}")
        ins.append(t)
    ins += [mb.add_constant(f"c{i}", np.asarray(c, np.int32)) for i, c in enumerate(consts)]
    out = mb.add_tensor("out", out_shape, out_type)
    opts = {BO.BATCH_MATMUL: options("BatchMatMulOptions"), BO.SUM: options("ReducerOptions"),
            BO.BROADCAST_TO: None, BO.SELECT_V2: options("SelectV2Options")}[code]
    mb.add_operator(code, ins, [out], opts)
    mb.outputs.append(out)
    mb.output_names.append("out")
    return bytes(serialize(mb).head)


@pytest.mark.parametrize("code, ins, out, consts, words", [
    (BO.BATCH_MATMUL, [[1, 2, 2, 4, 5], [1, 2, 2, 5, 3]], [1, 2, 2, 4, 3], (), "operand ranks 5 and 5"),
    (BO.SUM, [[2, 2, 2, 2, 3]], [2, 2, 2, 2], ([4],), "reductions take rank <= 4"),
    (BO.SUM, [[2, 3, 4, 5]], [3, 5], ([0, 2],), "4-D reduction to rank 2 (keepDims=False)"),
    (BO.BROADCAST_TO, [[2, 1, 2, 1, 2, 1]], [2, 3, 2, 3, 2, 3], ([2, 3, 2, 3, 2, 3],), "BROADCAST_TO is correct up to rank 5"),
    (BO.SELECT_V2, [[5, 4], [2, 1, 3, 5, 4], [2, 1, 3, 5, 4]], [2, 1, 3, 5, 4], (),
     "SELECT_V2 with broadcasting operands correctly up to rank 4"),
])
def test_verify_reports_ops_beyond_onert_ranks(code, ins, out, consts, words):
    data = _one_op(code, ins, out, consts)
    with pytest.raises(circle_fx.VerifyError) as info:
        circle_fx.verify(data)
    assert any(words in p for p in info.value.problems), info.value.problems


@pytest.mark.parametrize("axes, out", [([3], [2, 3, 4]), ([1, 2], [2, 5]), ([0, 1, 3], [4])])
def test_verify_accepts_the_four_d_reductions_onert_runs(axes, out):
    circle_fx.verify(_one_op(BO.SUM, [[2, 3, 4, 5]], out, (axes,)))


def test_verify_accepts_rank5_select_without_broadcasting():
    circle_fx.verify(_one_op(BO.SELECT_V2, [[2, 1, 3, 5, 4]] * 3, [2, 1, 3, 5, 4]))


class _Chunked(torch.nn.Module):
    """A delta-rule-like step on [B, H, chunks, C, D] with a dynamic chunk count."""

    def forward(self, k, mask):
        attn = torch.where(mask, 0.0, k @ k.transpose(-1, -2))  # rank-5 BATCH_MATMUL, broadcast SELECT_V2
        return (attn.unsqueeze(-1) * k.unsqueeze(-3)).sum(-2)  # rank-6 MUL, rank-5 SUM


def test_folds_keep_a_dynamic_dim():
    from torch.export import Dim

    torch.manual_seed(0)
    mask = torch.triu(torch.ones(8, 8, dtype=torch.bool))
    cm = circle_fx.export(_Chunked(), (r(1, 2, 3, 8, 4), mask), dynamic_shapes=({2: Dim("chunks", max=16)}, None))
    for n in (2, 5):
        k = r(1, 2, n, 8, 4)
        np.testing.assert_allclose(cm.run(k, mask)[0], _Chunked()(k, mask).numpy(), rtol=1e-5, atol=1e-5)


A5 = torch.randn(1, 3, 5, 2, 6, generator=torch.Generator().manual_seed(3))
B5 = torch.randn(1, 3, 5, 2, 6, generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize("fn, inputs", [
    (lambda a, b: (a < b).float() + (a >= b).float() * 2, (A5, B5)),         # same shape
    (lambda a, b: (a > b[:, :1, :, :, :1]).float(), (A5, B5)),               # broadcast in two places
    (lambda a, b: torch.where(a != b[..., :1, :], a, b), (A5, B5)),
], ids=["lt_ge_same_shape", "gt_broadcast", "ne_where"])
def test_5d_comparisons(fn, inputs):
    """onert 0.1.0's 5-D LESS / GREATER / NOT_EQUAL ... return wrong booleans with no error;
    emit/legalize/ranks.py merges dims to rank <= 4 after lowering (circle/limits.py: COMPARISON)."""
    assert_onert_matches_eager(Fn(fn), inputs, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fn, inputs", [
    (lambda x: x.sum(dim=2) + x.mean(dim=(2, 3)).unsqueeze(2), (r(1, 2, 3, 4, 5),)),
    # a one-hot against arange (a 5-D EQUAL), then summed
    (lambda i: (i.unsqueeze(-1) == torch.arange(3)).float().sum(-2), (torch.tensor([[[[0, 2], [1, 1]], [[2, 0], [0, 1]]]]),)),
    (lambda x, y: x < y, (r(1, 2, 3, 2, 2), torch.randn(1, 2, 3, 2, 2, generator=_gen((1, 2, 3, 2, 2), "y")))),
], ids=["sum_5d_middle_axis", "compare_5d_broadcast", "lt_5d_same_shape"])
def test_5d_family_forms_match_eager(fn, inputs):
    assert_onert_matches_eager(Fn(fn), inputs, **TOL)


def test_five_d_comparison_that_cannot_merge_is_refused():
    """Merging would need 5 axes: an error naming the op, not a silently wrong file."""
    a = torch.randint(0, 2, (2, 1, 2, 1, 2), generator=torch.Generator().manual_seed(0))
    b = torch.randint(0, 2, (1, 2, 1, 2, 1), generator=torch.Generator().manual_seed(1))
    with pytest.raises(circle_fx.UnsupportedOpError, match="5-D EQUAL"):
        circle_fx.export(Fn(lambda a, b: a == b), (a, b))
