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

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rms_cases import (Case, assert_matches_eager, assert_onert_fuses_and_matches, cases, expected_fusions,
                       fused_program, rms_nodes)

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
ONERT_FUZZ = settings(FUZZ, max_examples=80)


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
    assert_onert_fuses_and_matches(model, x, expected_fusions(case.sp)[0])


@pytest.mark.slow
@settings(FUZZ, max_examples=500)
@given(st.booleans().flatmap(lambda flawed: cases(flawed)))
def test_many_random_cases_fx(case):
    """The same property with a much larger budget (``make test-slow``)."""
    _check_fx(case)
