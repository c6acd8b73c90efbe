"""Soundness of the "scale after a projection" RMSNorm rules (HY-V4's unweighted norm).

HY-V4 writes ``F.linear(x, W) * rsqrt(mean(x**2, -1) + eps)``. A bias-free linear (or a
matmul with ``x`` on the left) commutes with a per-row scale, so the fusion rewrites it to
``linear(rms_norm(x), W)``. Each near miss below breaks one condition of that identity and
must stay unfused while still computing what eager computes:

- ``bias``: ``linear(x, W, b) * s`` scales the bias too;
- ``other_x``: the projection's input is not the normalised value;
- ``axis``: the mean runs over axis -2, so the scale is not per row;
- ``narrow_scale``: the scale is rounded to bfloat16 before the multiplication;
- ``vector_rhs``: ``x @ v`` with a 1-D ``v`` drops the row axis, the scale then broadcasts
  into a new one (the result's shape is not the projection's).

Properties (Hypothesis, fixed budget, ``derandomize=True``): the fused FX graph has one
``circle::rms_norm`` exactly for the flawless cases and matches eager (``rms_cases``
tolerances); the float32 cases exported and run in onert have that many ``RMS_NORM`` ops and
match eager within 1e-5.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import circle_fx
from rms_cases import assert_matches_eager, assert_onert_fuses_and_matches, fused_program, rms_nodes

FLAWS = ("bias", "other_x", "axis", "narrow_scale", "vector_rhs")
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ONERT_FUZZ = settings(FUZZ, max_examples=25)


@dataclass(frozen=True)
class ProjCase:
    kind: str = "linear"        # "linear" | "matmul"
    flaw: str = "none"
    square: str = "pow"         # "pow" | "mul" | "square"
    reduce: str = "mean"        # "mean" | "sum_div"
    hy_casts: bool = False      # HY-V4: variance on x.float(), scale cast back to x's dtype
    scale_left: bool = False
    eps: float = 1e-6
    shape: tuple = (2, 5, 16)
    out: int = 8
    dtype: torch.dtype = torch.float32

    def build(self):
        model = ProjNorm(self)
        x = torch.randn(*self.shape, generator=torch.Generator().manual_seed(3)) * 3
        return model.to(self.dtype), x.to(self.dtype)


class ProjNorm(torch.nn.Module):
    def __init__(self, case: ProjCase):
        super().__init__()
        self.case = case
        d = case.shape[-1]
        k = d if case.flaw == "axis" else case.out  # a per-column scale must broadcast over k
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(k, d, generator=g) / d ** 0.5)
        self.b = torch.nn.Parameter(torch.randn(k, generator=g))

    def forward(self, x):
        c = self.case
        v = x.float() if c.hy_casts else x
        s = {"pow": lambda: v.pow(2), "mul": lambda: v * v, "square": lambda: torch.square(v)}[c.square]()
        axis = -2 if c.flaw == "axis" else -1
        ms = s.mean(axis, keepdim=True) if c.reduce == "mean" else s.sum(axis, keepdim=True) / s.shape[axis]
        scale = torch.rsqrt(ms + c.eps)
        if c.hy_casts:
            scale = scale.to(x.dtype)
        if c.flaw == "narrow_scale":
            scale = scale.to(torch.bfloat16)
        inp = x + 1.0 if c.flaw == "other_x" else x
        if c.flaw == "vector_rhs":
            proj = inp @ self.w[0]
        elif c.kind == "matmul":
            proj = torch.matmul(inp, self.w.t())
        else:
            proj = F.linear(inp, self.w, self.b if c.flaw == "bias" else None)
        return scale * proj if c.scale_left else proj * scale


@st.composite
def proj_cases(draw, flawed: bool, dtypes=(torch.float32, torch.float16, torch.bfloat16), onert=False):
    flaw = draw(st.sampled_from([f for f in FLAWS if not (onert and f == "narrow_scale")])) if flawed else "none"
    kind = "matmul" if flaw == "vector_rhs" else ("linear" if flaw == "bias" else
                                                  draw(st.sampled_from(["linear", "matmul"])))
    d = draw(st.integers(2, 24))
    rows = draw(st.integers(2 if flaw == "axis" else 1, 5))
    # x @ v ([rows]) against the [rows, 1] scale only broadcasts for a 2-D x (to [rows, rows])
    lead = () if flaw == "vector_rhs" else tuple(draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 2))))
    case = ProjCase(kind=kind, flaw=flaw, square=draw(st.sampled_from(["pow", "mul", "square"])),
                    reduce=draw(st.sampled_from(["mean", "sum_div"])), hy_casts=draw(st.booleans()),
                    scale_left=draw(st.booleans()), eps=draw(st.sampled_from([1e-6, 1e-5, 1e-12])),
                    shape=lead + (rows, d), out=draw(st.integers(1, 12)), dtype=draw(st.sampled_from(dtypes)))
    event(f"kind={kind} flaw={flaw}")
    note(repr(case))
    return case


def _check_fx(case: ProjCase):
    model, x = case.build()
    program = fused_program(model, x)
    nodes = rms_nodes(program)
    assert len(nodes) == (1 if case.flaw == "none" else 0), program.gm.graph
    assert all(n.args[1] is None for n in nodes)
    assert_matches_eager(model, program, x)


@FUZZ
@given(proj_cases(flawed=False))
def test_scale_after_projection_fuses(case):
    _check_fx(case)


@FUZZ
@given(proj_cases(flawed=True))
def test_projection_near_misses_do_not_fuse(case):
    _check_fx(case)


@ONERT_FUZZ
@given(st.booleans().flatmap(lambda flawed: proj_cases(flawed, dtypes=(torch.float32,), onert=True)))
def test_projection_cases_in_onert(case):
    model, x = case.build()
    assert_onert_fuses_and_matches(model, x, 1 if case.flaw == "none" else 0)


def _one_each():
    yield ProjCase()
    yield ProjCase(kind="matmul", hy_casts=True, scale_left=True)
    for flaw in FLAWS:
        if flaw != "narrow_scale":
            yield ProjCase(kind="matmul" if flaw == "vector_rhs" else "linear", flaw=flaw,
                           shape=(5, 16) if flaw == "vector_rhs" else (2, 5, 16))


def test_every_flaw_and_the_positive_case_in_onert():
    """Not left to the draw: each flaw once, and the positive case, in onert."""
    for case in _one_each():
        test_projection_cases_in_onert.hypothesis.inner_test(case)


@pytest.mark.parametrize("case, rule, check, words", [
    (ProjCase(flaw="bias"), "rms_norm_before_linear", "_check_no_bias", "adds a bias"),
    (ProjCase(flaw="axis"), "rms_norm_before_linear", "_check_last_axis", "not the last axis"),
    (ProjCase(flaw="narrow_scale"), "rms_norm_before_linear", "_check_projection_kept", "rounds the scale"),
    (ProjCase(kind="matmul", flaw="vector_rhs", shape=(5, 16)), "rms_norm_before_matmul",
     "_check_projection_kept", "not the projection's [5]"),
    (ProjCase(flaw="other_x"), "rms_norm_before_linear", None, "'x' must be one value"),
], ids=["bias", "axis", "narrow_scale", "vector_rhs", "other_x"])
def test_explain_names_the_failed_condition(case, rule, check, words):
    model, x = case.build()
    result = circle_fx.explain(model, (x,))
    assert result.fused == [] and len(result.entries) == 1, result.format()
    entry = result.entries[0]
    assert (entry.rule, entry.check) == (rule, check) and words in entry.reason, entry.format()


def test_explain_reports_the_fused_rule():
    model, x = ProjCase(kind="matmul").build()
    result = circle_fx.explain(model, (x,))
    assert result.entries == [] and [f.rules for f in result.fused] == [["rms_norm_before_matmul"]], result.format()
