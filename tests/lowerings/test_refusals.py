"""A lowering states the forms it refuses once, where it is registered; the decomposition pass,
the emitter's up-front check and ``explain`` all read that one statement."""
from __future__ import annotations

import pytest
import torch

import circle_fx
from circle_fx.emit.registry import LOWERINGS, REFUSALS, lowering, refusal
from circle_fx.passes.decompositions import REFUSED_FORMS
from circle_fx.emit.registry import lowering_for
from onert_eager import Fn, assert_onert_matches_eager, randn

aten = torch.ops.aten


class WideIntSum(torch.nn.Module):
    """An int64-result sum of int32 values: onert has no int64 SUM, and int32 may overflow."""

    def forward(self, x):
        return x.sum(-1)


class SoftmaxMiddle(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x * 2, dim=1)


def test_every_refused_form_decomposition_belongs_to_a_stated_refusal():
    assert set(REFUSED_FORMS) <= set(REFUSALS), set(REFUSED_FORMS) - set(REFUSALS)


def test_a_refused_node_that_cannot_be_rewritten_is_reported_with_the_reason():
    with pytest.raises(circle_fx.UnsupportedOpError) as info:
        circle_fx.export(WideIntSum(), (torch.ones(2, 5, dtype=torch.int32),))
    msg = str(info.value)
    assert "aten.sum" in msg and "no int64 SUM kernel" in msg and "nothing was written" in msg


def test_explain_lists_refused_nodes():
    result = circle_fx.explain(WideIntSum(), (torch.ones(2, 5, dtype=torch.int32),))
    assert [r.op for r in result.refused] == ["aten.sum.dim_IntList"]
    assert "refused by their lowering: 1" in result.format() and "no int64 SUM kernel" in result.format()


def test_a_refused_form_with_an_exact_rewrite_exports_and_runs():
    x = torch.randn(2, 3, 4)
    cm = circle_fx.export(SoftmaxMiddle(), (x,))
    torch.testing.assert_close(torch.from_numpy(cm.run(x)[0].copy()), SoftmaxMiddle()(x), atol=1e-5, rtol=1e-5)


def test_refusal_is_registered_with_the_lowering_and_replaced_with_it():
    target = aten.softmax.int
    old_fn, old_why = LOWERINGS[target], REFUSALS[target]
    gm = torch.export.export(SoftmaxMiddle(), (torch.randn(2, 3, 4),)).module()
    node = next(n for n in gm.graph.nodes if n.target is aten.softmax.int)
    assert "only the last axis" in refusal(node)
    try:
        lowering(target, override=True, refuses=lambda info, n: f"rank {info.rank(n.args[0])} is refused")(old_fn)
        assert refusal(node) == "rank 3 is refused"

        @lowering(target, override=True)
        def any_axis(ctx, n):  # pragma: no cover - never called
            raise AssertionError
        assert refusal(node) is None  # a new lowering without refusals takes every form
    finally:
        lowering(target, override=True, refuses=old_why)(old_fn)


def test_int64_sum_is_a_clear_error():
    """A sum of int64 values (not provably within int32) stays a clear error; a sum of bools
    is exact as an int32 SUM (``test_refused_form_is_rewritten_and_matches_eager[sum_bool_int64]``)."""
    with pytest.raises(circle_fx.UnsupportedOpError, match="int32"):
        circle_fx.export(Fn(lambda x: (x * 1000).long().sum(dim=-1)), (torch.randn(3, 7),))


CONTEXT = torch.tensor([[1, 0, 1, 1], [0, 0, 1, 0]], dtype=torch.int32)

# Forms the lowering refuses, each written the way a transformers family writes it, rewritten
# exactly by decompositions.REFUSED_FORMS. Tolerance 1e-5; integer results compare exactly.
REFUSED_CASES = {
    "softmax_axis_2_of_4d": (Fn(lambda x: x.softmax(dim=2) * 2), [randn(1, 3, 4, 5)]),   # DeepSeek-V4 gate
    "softmax_axis_1_dtype": (Fn(lambda x: torch.softmax(x, 1, dtype=torch.float32)), [randn(2, 6, 3)]),
    "log_softmax_axis_0": (Fn(lambda x: torch.log_softmax(x, 0)), [randn(5, 3)]),
    # (ids != pad).sum(-1): XLM, CPM-Ant
    "sum_bool_int64": (Fn(lambda x: ((x > 0).sum(-1), (x > 0).sum(), (x < 0).sum(1, keepdim=True))), [randn(2, 6, 5)]),
    "int_and_or_of_flags": (Fn(lambda x: (CONTEXT | (x > 0)) & (x < 1)), [randn(2, 4)]),   # CPM-Ant's mask
    "time_shift_crop_pad": (torch.nn.ZeroPad2d((0, 0, 1, -1)), [randn(1, 5, 4)]),          # RWKV
    "crop_both_ends": (Fn(lambda x: torch.nn.functional.pad(x, (-1, 2, -2, 0), value=3.0)), [randn(2, 5, 4)]),
}


@pytest.mark.parametrize("name", list(REFUSED_CASES))
def test_refused_form_is_rewritten_and_matches_eager(name):
    module, inputs = REFUSED_CASES[name]
    assert_onert_matches_eager(module, inputs, rtol=1e-5, atol=1e-5)


def test_refused_forms_have_lowerings():
    """The cases exercise the refused-form route, not the plain no-lowering one."""
    for op in REFUSED_FORMS:
        assert lowering_for(op) is not None, op
