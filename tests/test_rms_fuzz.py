"""Property tests: random RMSNorm spellings fuse, random near misses do not, and the
result always computes what eager PyTorch computes.

A drawn case combines every choice in ``rms_cases`` (square / reduction / inverse
spelling, eps position and value, weight position incl. Gemma's ``1 + w`` and none, casts
in the Llama / GPT-OSS / T5 / written-twice styles), a random shape (rank 1-4, or a 4-D
head layout), dtype (float32 / float16 / bfloat16 for the FX-level checks, float32 for
onert), weight dtype, and surrounding ops (affine or Linear before; residual or SiLU
after). Near misses add one flaw from ``rms_cases.FLAWS``.

Property: the fused graph has as many ``circle::rms_norm`` nodes as
:func:`rms_cases.expected_fusions` says (1 for an RMSNorm, 0 for a near miss, the core
only for a mismatching weight), and ``program.run`` (or onert) matches eager; tolerances
as in ``rms_cases.tolerance`` (float32 1e-5; half types 4 ulp of the dtype).

Budget: fixed example counts, ``derandomize=True`` (same examples every run, no example
database), no deadline. ``make test`` prints the statistics (``event`` lines show the mix).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import HealthCheck, event, note, settings
from hypothesis import strategies as st
from hypothesis import given

import circle_fx
from rms_cases import (CASTS, FLAWS, INVERSES, REDUCES, SQUARES, WEIGHTS, NormModule, Spelling,
                       assert_matches_eager, expected_fusions, fused_program, rms_nodes)

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ONERT_FUZZ = settings(FUZZ, max_examples=40)

EPS = st.sampled_from([1e-6, 1e-5, 1e-12]) | st.floats(1e-9, 1e-2, allow_nan=False)

spellings = st.builds(Spelling, square=st.sampled_from(SQUARES), reduce=st.sampled_from(REDUCES),
                      inverse=st.sampled_from(INVERSES), eps_first=st.booleans(),
                      weight=st.sampled_from(WEIGHTS), cast=st.sampled_from(CASTS), eps=EPS)


@dataclass
class Case:
    sp: Spelling
    shape: tuple
    heads: int
    dtype: torch.dtype
    wdtype: torch.dtype
    pre: str
    post: str

    def build(self):
        rows = self.heads if self.heads else (self.shape[-2] if len(self.shape) > 1 else 1)
        model = NormModule(self.sp, self.shape[-1], wdtype=self.wdtype, pre=self.pre, post=self.post,
                           heads=self.heads, rows=rows)
        if self.pre == "linear":
            model.lin.to(self.dtype)
        x = torch.randn(*self.shape, generator=torch.Generator().manual_seed(hash(self.shape) % 1000))
        return model, x.to(self.dtype)


@st.composite
def cases(draw, flawed: bool, dtypes=(torch.float32, torch.float16, torch.bfloat16), onert=False):
    sp = draw(spellings)
    if flawed:
        flaw = draw(st.sampled_from([f for f in FLAWS if not (onert and f in ("var_used", "scale_used"))]))
        if flaw == "weight_shape" and sp.weight == "none":
            sp = sp.but(weight="after")
        sp = sp.but(flaw=flaw)
    dtype = draw(st.sampled_from(dtypes))
    others = [d for d in (torch.float32, torch.float16, torch.bfloat16) if d != dtype]
    if onert:
        # Circle/onert here is float32 only: a float16 weight is fine when it is folded into
        # the fused node (widened at compile time), but not in an unfused mul (onert cannot
        # CAST from float16), nor with T5's cast of the activations *to* the weight dtype.
        plain_fp16 = not flawed and sp.cast != "t5"
        wdtype = draw(st.sampled_from([dtype, dtype, torch.float16])) if plain_fp16 else dtype
    else:
        wdtype = draw(st.sampled_from([dtype, dtype] + others))
    needs_rows = sp.flaw in ("axis", "axes", "weight_shape")
    heads = draw(st.sampled_from([0, 0, 0, 2, 4]))
    d = draw(st.integers(2, 24))
    if heads:
        shape = (draw(st.integers(1, 2)), draw(st.integers(1, 4)), heads * d)
    else:
        rank = draw(st.integers(2 if needs_rows else 1, 4))
        shape = tuple(draw(st.integers(1, 4)) for _ in range(rank - 1)) + (d,)
    pre = draw(st.sampled_from(["none", "affine", "linear"]))
    post = draw(st.sampled_from(["none", "residual", "silu"]))
    case = Case(sp, shape, heads, dtype, wdtype, pre, post)
    event(f"flaw={sp.flaw}" if flawed else f"cast={sp.cast} weight={sp.weight}")
    event(f"dtype={str(dtype)[6:]}" + (" heads" if heads else f" rank={len(shape)}"))
    note(repr(case))
    return case


def _check_fx(case: Case):
    model, x = case.build()
    program = fused_program(model, x)
    nodes = rms_nodes(program)
    count, weighted = expected_fusions(case.sp)
    assert len(nodes) == count, program.gm.graph
    assert all((n.args[1] is not None) == weighted for n in nodes), program.gm.graph
    assert_matches_eager(model, program, x)


@FUZZ
@given(cases(flawed=False))
def test_random_rms_norm_spellings_fuse(case):
    _check_fx(case)


@FUZZ
@given(cases(flawed=True))
def test_random_near_misses_do_not_fuse(case):
    _check_fx(case)


@ONERT_FUZZ
@given(st.booleans().flatmap(lambda flawed: cases(flawed, dtypes=(torch.float32,), onert=True)))
def test_random_cases_in_onert_float32(case):
    """The exported model, run in onert: RMS_NORM count as expected, outputs = eager."""
    model, x = case.build()
    cm = circle_fx.export(model, (x,))
    count, _ = expected_fusions(case.sp)
    assert cm.op_histogram().get("RMS_NORM", 0) == count, cm.op_histogram()
    got = cm.run(x)
    with torch.no_grad():
        want = model(x)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5, equal_nan=True)
