"""Near misses: graphs that look like RMSNorm but are not, and must not be fused.

Each flaw (see ``rms_cases.FLAWS``) is applied to several spellings; the fused graph must
contain no ``circle::rms_norm`` and still compute what eager PyTorch computes. The one
deliberate exception is a mismatching weight (see :func:`test_mismatched_weight_is_not_folded`).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import circle_fx
from onert_eager import assert_onert_matches_eager
from rms_cases import FLAWS, NormModule, Spelling, assert_matches_eager, expected_fusions, fused_program, rms_nodes

aten = torch.ops.aten
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FLAWS_NOT_WEIGHT = [f for f in FLAWS if f != "weight_shape"]
#: spellings each flaw is applied to: plain, the "/ sqrt" family with the weight inside,
#: and Llama's casts with the weight in front
CARRIERS = [Spelling(), Spelling(inverse="div_sqrt", weight="inside", square="mul", reduce="sum_div"),
            Spelling(cast="llama", weight="before", inverse="pow_m05", eps_first=True)]


def _shape(flaw, rows=7, d=16):
    """The near misses' input shape; "nokeep" (a mean whose dim is never re-added) only
    broadcasts back against x, along the wrong axis, when rows == D and the batch is 1."""
    return (1, d, d) if flaw == "nokeep" else (2, rows, d)


def _run(sp, shape=(2, 7, 16), dtype=torch.float32, heads=0):
    rows = heads if heads else shape[-2]
    model = NormModule(sp, shape[-1], wdtype=dtype, heads=heads, rows=rows)
    x = torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    program = fused_program(model, x)
    assert_matches_eager(model, program, x)
    return model, program


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("carrier", range(len(CARRIERS)))
@pytest.mark.parametrize("flaw", FLAWS_NOT_WEIGHT)
def test_near_miss_is_not_fused(flaw, carrier, dtype):
    sp = CARRIERS[carrier].but(flaw=flaw)
    _, program = _run(sp, shape=_shape(flaw), dtype=dtype)
    assert rms_nodes(program) == [], program.gm.graph


@pytest.mark.parametrize("flaw", FLAWS_NOT_WEIGHT)
def test_near_miss_on_head_dim_is_not_fused(flaw):
    # "nokeep": heads == head dim, so the un-re-added mean broadcasts (along the wrong axis)
    _, program = _run(Spelling(flaw=flaw), shape=(1, 1, 16) if flaw == "nokeep" else (2, 3, 32), heads=4)
    assert rms_nodes(program) == []


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("weight", ["after", "before", "gemma", "inside", "on_scale"])
def test_mismatched_weight_is_not_folded(weight, dtype):
    """Design decision: a weight whose shape does not match the normalised dimension
    (here ``[rows, D]``, which broadcasts but is not per-channel) is never folded into the
    fused node. When it multiplies the *normalised value* (after/before/Gemma), the
    unweighted core ``x * rsqrt(mean(x**2) + eps)`` is still a genuine RMSNorm and fuses,
    and the mismatching mul stays outside, applied to the fused node's output. When it
    sits between ``x`` and the scale (inside/on_scale) no RMSNorm is left, nothing fuses.
    Either way the numerics must hold."""
    sp = Spelling(weight=weight, flaw="weight_shape")
    model, program = _run(sp, dtype=dtype)
    nodes = rms_nodes(program)
    count, _ = expected_fusions(sp)
    assert len(nodes) == count, program.gm.graph
    bad = [n for n in program.gm.graph.nodes if n.op == "get_attr" and list(n.meta["val"].shape) == [7, 16]]
    assert bad, "the mismatching weight must still be in the graph"
    for node in nodes:
        assert node.args[1] is None, "a mismatching weight was folded into the fused node"
        (user,) = node.users
        assert user.target is aten.mul.Tensor and set(user.all_input_nodes) == {node, bad[0]}


def test_interior_value_shared_blocks_fusion_only_when_shared():
    """Recomputing the variance (two separate nodes) is not sharing: the norm fuses and the
    recomputed copy stays. Using the norm's own variance elsewhere blocks the fusion."""

    class Recomputes(torch.nn.Module):
        def forward(self, x):
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
            return y, x.pow(2).mean(-1, keepdim=True)

    class Shares(torch.nn.Module):
        def forward(self, x):
            v = x.pow(2).mean(-1, keepdim=True)
            return x * torch.rsqrt(v + 1e-6), v

    x = torch.randn(2, 5, 16)
    for cls, expected in ((Recomputes, 1), (Shares, 0)):
        program = fused_program(cls(), x)
        assert len(rms_nodes(program)) == expected, cls.__name__
        assert_matches_eager(cls(), program, x)


def test_eps_that_is_not_a_constant_is_not_fused():
    class DataEps(torch.nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + x[..., :1].abs())

    x = torch.randn(2, 5, 16)
    program = fused_program(DataEps(), x)
    assert rms_nodes(program) == []
    assert_matches_eager(DataEps(), program, x)


def test_scale_on_a_different_tensor_is_not_fused():
    class OtherX(torch.nn.Module):
        def forward(self, x):
            return (x + 1) * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    x = torch.randn(2, 5, 16)
    program = fused_program(OtherX(), x)
    assert rms_nodes(program) == []
    assert_matches_eager(OtherX(), program, x)


def test_sum_divided_by_the_wrong_count_is_not_fused():
    class WrongN(torch.nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) / 7 + 1e-6)

    x = torch.randn(2, 5, 16)
    program = fused_program(WrongN(), x)
    assert rms_nodes(program) == []
    assert_matches_eager(WrongN(), program, x)


# ----------------------------------------------------------------------------- onert

ONERT_FLAWS = [f for f in FLAWS if f not in ("var_used", "scale_used")]


@pytest.mark.parametrize("flaw", ONERT_FLAWS)
def test_onert_float32_near_miss(flaw):
    sp = Spelling(flaw=flaw)
    shape = _shape(flaw)
    model = NormModule(sp, 16, rows=shape[1])
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    cm = circle_fx.export(model, (x,))
    count, _ = expected_fusions(sp)
    assert cm.op_histogram().get("RMS_NORM", 0) == count
    (got,) = cm.run(x)
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


# onert 0.1.0 overwrites a model output that later ops also read (the variance buffer received
# RSQRT's result); the output_copies legalization step gives such outputs their own tensor
@pytest.mark.parametrize("flaw", ["var_used", "scale_used"])
def test_onert_float32_interior_output(flaw):
    model = NormModule(Spelling(flaw=flaw), 16)
    x = torch.randn(2, 5, 16)
    cm = assert_onert_matches_eager(model, (x,), rtol=1e-5, atol=1e-5)  # both outputs, counted
    assert cm.op_histogram().get("RMS_NORM", 0) == 0


def test_variance_in_lower_precision_is_not_fused():
    """A down-cast before the square (float32 input, float16 variance) is not fused: the
    fused op would accumulate in float32 and silently change the result."""

    class Narrow(torch.nn.Module):
        def forward(self, x):
            return x * torch.rsqrt(x.half().pow(2).mean(-1, keepdim=True) + 1e-3)

    x = torch.randn(2, 5, 16)
    program = fused_program(Narrow(), x)
    assert rms_nodes(program) == []
    assert_matches_eager(Narrow(), program, x)


def test_square_rounded_before_a_widening_mean_is_not_fused():
    """``x.pow(2).mean(-1, dtype=torch.float32)`` on bfloat16 squares in bfloat16 and only
    then widens (torch casts the *input of the mean*); the fused op would square in float32,
    so this stays unfused (canonicalized to ``mean(pow(x, 2).float())``) and exact."""

    class SquareThenWiden(torch.nn.Module):
        def forward(self, x):
            return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True, dtype=torch.float32) + 1e-6)).to(x.dtype)

    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    program = fused_program(SquareThenWiden(), x)
    assert rms_nodes(program) == []
    assert_matches_eager(SquareThenWiden(), program, x)


# Two graphs the structural pattern takes for an RMSNorm but whose fusion would change the
# result: an epsilon tensor that broadcasts the variance to a higher rank changes the output
# shape, and an integer cast between the norm and its weight truncates values.

class _EpsBroadcastsRank(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.register_buffer("eps", torch.full((1, 1, 1, 1), 1e-6))
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w


class _IntegerCastBeforeWeight(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return y.to(torch.int32) * self.w


def _x():
    return torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(0)) * 3


def test_epsilon_that_changes_the_rank_is_not_fused():
    model, x = _EpsBroadcastsRank(16), _x()
    program = fused_program(model, x)
    assert rms_nodes(program) == [], program.gm.graph
    assert_matches_eager(model, program, x)
    assert program.run(x)[0].shape == (1, 2, 3, 16)


def test_integer_cast_between_norm_and_weight_keeps_the_weight_out():
    model, x = _IntegerCastBeforeWeight(16), _x()
    program = fused_program(model, x)
    # the float core is a genuine RMSNorm and may fuse; the weight must not be folded
    # across the truncating cast
    assert all(n.args[1] is None for n in rms_nodes(program)), program.gm.graph
    assert_matches_eager(model, program, x)


def test_program_fusions_lists_records_and_does_not_break_fusion():
    model, x = _IntegerCastBeforeWeight(16), _x()
    program = circle_fx.capture(model, (x,))
    assert program.fusions() == []  # calling it early must not disturb the fuse pass
    cm = circle_fx.lower(program)
    assert [f.kind for f in program.fusions()] == ["rms_norm"]
    assert len(cm.report.fusions) == 1
