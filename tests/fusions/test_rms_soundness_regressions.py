"""Regression tests for two unsound fusions found in review, and ``Program.fusions()``.

Both models below *look* like an RMSNorm to the structural pattern, but fusing them changed
the result: an epsilon tensor that broadcasts the variance to a higher rank changes the
output shape, and an integer cast between the norm and its weight truncates values. They
must stay unfused and match eager.
"""
from __future__ import annotations

import torch

import circle_fx
from rms_cases import assert_matches_eager, fused_program, rms_nodes


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
