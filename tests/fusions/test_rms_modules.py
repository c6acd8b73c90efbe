"""End to end for RMSNorm written every common way, each run in onert against eager.

``torch.nn.RMSNorm`` exports as a single ``aten.rms_norm`` (turned into ``circle.rms_norm``
by the decompose pass); hand-written modules export as the decomposed chain, which the
canonicalize + fuse passes must collapse. Either way the file must hold exactly one
RMS_NORM per norm, with the module's weight and epsilon, and nothing decomposed left.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from circle_fx.circle.reader import read_circle

from onert_eager import assert_onert_matches_eager
from rms_cases import rms_epsilon

ATOL = 1e-4
D = 16
DECOMPOSED = ("POW", "RSQRT", "MEAN", "SQRT", "SQUARE", "SUM", "DIV")


def _random_weight(shape) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.randn(shape, generator=torch.Generator().manual_seed(1)))


def _export_and_compare(model, x, **kw):
    return assert_onert_matches_eager(model, (x,), rtol=0, atol=ATOL, **kw)


def _rms_norm_ops(cm):
    cf = read_circle(cm.to_bytes())
    return cf, [op for op in cf.operators if op.name == "RMS_NORM"]


# --------------------------------------------------------------------- torch.nn.RMSNorm

@pytest.mark.parametrize("shape", [(2, 5, D), (3, D), (2, 3, 4, D)], ids=["3d", "2d", "4d"])
def test_nn_rmsnorm_becomes_one_rms_norm(shape):
    norm = torch.nn.RMSNorm(D, eps=1e-6)
    norm.weight = _random_weight(D)
    cm = _export_and_compare(norm, torch.randn(*shape))
    hist = cm.op_histogram()
    assert hist["RMS_NORM"] == 1
    assert not any(hist[k] for k in DECOMPOSED), dict(hist)
    assert set(hist) <= {"RMS_NORM", "RESHAPE"}  # 2-D input is reshaped to 3-D around it
    cf, (op,) = _rms_norm_ops(cm)
    np.testing.assert_array_equal(cf.tensor_data(op.inputs[1]), norm.weight.detach().numpy())
    assert rms_epsilon(op) == pytest.approx(1e-6, rel=1e-6)


def test_nn_rmsnorm_without_weight_and_default_eps():
    """``eps=None`` means ``finfo(float32).eps``; no weight means a gamma of ones."""
    norm = torch.nn.RMSNorm(D, elementwise_affine=False)
    x = torch.randn(2, 5, D) * 1e-3  # small values make eps matter
    cm = _export_and_compare(norm, x)
    cf, (op,) = _rms_norm_ops(cm)
    np.testing.assert_array_equal(cf.tensor_data(op.inputs[1]), np.ones(D, np.float32))
    assert rms_epsilon(op) == pytest.approx(torch.finfo(torch.float32).eps, rel=1e-6)


def test_nn_rmsnorm_over_two_axes_is_spelled_out():
    """Circle's RMS_NORM reduces one axis; normalising over (4, 8) must still be exact."""
    norm = torch.nn.RMSNorm((4, 8), eps=1e-5)
    norm.weight = _random_weight((4, 8))
    cm = _export_and_compare(norm, torch.randn(2, 3, 4, 8))
    hist = cm.op_histogram()
    assert hist["RMS_NORM"] == 0 and hist["MEAN"] == 1 and hist["RSQRT"] == 1


def test_nn_rmsnorm_with_passes_empty_still_lowers():
    """The decompose pass is part of the always-run finalize pipeline."""
    norm = torch.nn.RMSNorm(D, eps=1e-6)
    cm = _export_and_compare(norm, torch.randn(2, 5, D), passes=[])
    assert cm.op_histogram()["RMS_NORM"] == 1


# ------------------------------------------------------------ hand-written RMSNorm modules

class LlamaStyle(torch.nn.Module):
    """As in transformers: cast up, variance, rsqrt, cast back, weight last."""

    def __init__(self):
        super().__init__()
        self.weight = _random_weight(D)
        self.eps = 1e-6

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.eps)
        return self.weight * h.to(dtype)


class SquareSpelling(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = _random_weight(D)

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5) * self.weight


class SumOverNDivSqrt(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = _random_weight(D)

    def forward(self, x):
        return self.weight * (x / torch.sqrt(torch.sum(x.square(), dim=-1, keepdim=True) / D + 1e-5))


class GemmaStyle(torch.nn.Module):
    """``(1 + weight)``: a constant after folding, so it fuses like a plain weight."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(_random_weight(D).detach() * 0.1)

    def forward(self, x):
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (out * (1.0 + self.weight.float())).type_as(x)


class NoWeightPowMinusHalf(torch.nn.Module):
    def forward(self, x):
        return x * torch.pow(x.pow(2).mean(-1, keepdim=True) + 1e-6, -0.5)


HAND_WRITTEN = [LlamaStyle, SquareSpelling, SumOverNDivSqrt, GemmaStyle, NoWeightPowMinusHalf]


@pytest.mark.parametrize("cls", HAND_WRITTEN, ids=lambda c: c.__name__)
def test_hand_written_rmsnorm_fuses_to_one_rms_norm(cls):
    model = cls()
    cm = _export_and_compare(model, torch.randn(2, 5, D))
    hist = cm.op_histogram()
    assert dict(hist) == {"RMS_NORM": 1}
    assert len(cm.report.fusions) == 1 and cm.report.fusions[0].kind == "rms_norm"
    assert __file__.rsplit("/", 1)[-1] in cm.report.fusions[0].source  # points at this file's forward
    cf, (op,) = _rms_norm_ops(cm)
    gamma = cf.tensor_data(op.inputs[1])
    if hasattr(model, "weight"):
        want = model.weight.detach().numpy() + (1.0 if cls is GemmaStyle else 0.0)
        np.testing.assert_allclose(gamma, want, rtol=0, atol=0)
    else:
        np.testing.assert_array_equal(gamma, np.ones(D, np.float32))


class Block(torch.nn.Module):
    """norm -> Linear(bias) -> ReLU -> Linear(no bias) -> residual, twice."""

    def __init__(self):
        super().__init__()
        self.norms = torch.nn.ModuleList([LlamaStyle(), torch.nn.RMSNorm(D, eps=1e-5)])
        self.up = torch.nn.ModuleList([torch.nn.Linear(D, 24), torch.nn.Linear(D, 24)])
        self.down = torch.nn.ModuleList([torch.nn.Linear(24, D, bias=False), torch.nn.Linear(24, D, bias=False)])

    def forward(self, x):
        for norm, up, down in zip(self.norms, self.up, self.down):
            x = x + down(torch.relu(up(norm(x))))
        return x


def test_block_with_norms_and_linears_keeps_weights_out_in():
    torch.manual_seed(3)
    model = Block()
    cm = _export_and_compare(model, torch.randn(2, 5, D))
    hist = cm.op_histogram()
    assert hist["RMS_NORM"] == 2 and hist["FULLY_CONNECTED"] == 4 and hist["TRANSPOSE"] == 0
    assert not any(hist[k] for k in DECOMPOSED), dict(hist)
    cf = read_circle(cm.to_bytes())
    fcs = [op for op in cf.operators if op.name == "FULLY_CONNECTED"]
    linears = [m for pair in zip(model.up, model.down) for m in pair]
    for op, lin in zip(fcs, linears):  # execution order: up0, down0, up1, down1
        np.testing.assert_array_equal(cf.tensor_data(op.inputs[1]), lin.weight.detach().numpy())
        if lin.bias is None:
            assert op.inputs[2] == -1
        else:
            np.testing.assert_array_equal(cf.tensor_data(op.inputs[2]), lin.bias.detach().numpy())
