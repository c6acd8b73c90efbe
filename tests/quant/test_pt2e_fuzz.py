"""Property tests on quantized graphs: random RMSNorm spellings and
near misses from ``rms_cases``, quantized with ``CircleQuantizer`` through PT2E, fuse iff
they are RMSNorms — the Q/DQ nodes the quantizer inserts around a norm do not hide it,
and those it inserts inside a near miss do not make one.

Property: after the Q/DQ passes and the default pipeline (target ``onert``), the graph has
as many ``circle::rms_norm`` nodes as :func:`rms_cases.expected_fusions` says, weighted
iff it says so, and the rewritten graph computes what the fake-quantized torch model
computes (within one step of the output's quantization where the output is quantized,
else 1e-4 relative).

Budget: float32 only (the quantizer's observers), ``derandomize=True``, modest counts.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from hypothesis import HealthCheck, assume, given, settings

import circle_fx
from circle_fx.passes import default_pipeline, finalize_pipeline, run_passes
from circle_fx.quant.qdq import bracket, is_dq
from pt2e_util import quantize_pt2e
from rms_cases import as_tuple, cases, expected_fusions, rms_nodes

QFUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _check(case):
    case = replace(case, wdtype=torch.float32)
    model, x = case.build()
    with torch.no_grad():
        assume(bool(torch.isfinite(as_tuple(model(x))[0]).all()))  # observers reject NaN (pow3 of negatives)
    g = torch.Generator().manual_seed(7)
    converted = quantize_pt2e(model, (x,), [(x,), (torch.randn(x.shape, generator=g),)])
    program = circle_fx.capture(converted, (x,))
    # target None: the default ("onert") when the quantizer annotated something; a near miss
    # with no linear/add/mul of two tensors has no Q/DQ at all and is a float graph
    run_passes(program, bracket(program, default_pipeline(), None))
    run_passes(program, finalize_pipeline())
    nodes = rms_nodes(program)
    count, weighted = expected_fusions(case.sp)
    assert len(nodes) == count, program.gm.graph
    assert all((n.args[1] is not None) == weighted for n in nodes), program.gm.graph
    got = program.run(x)
    with torch.no_grad():
        want = as_tuple(converted(x))
    outs = program.gm.graph.output_node().args[0]
    assert len(got) == len(want) == len(outs)
    for g_, w_, node in zip(got, want, outs):
        # one step of the output's quantization where the output is dequantized, else float
        tol = dict(rtol=0, atol=float(node.args[1]) * 1.001) if is_dq(node) else dict(rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(g_, w_, **tol)


@QFUZZ
@given(cases(flawed=False, dtypes=(torch.float32,), onert=True))
def test_quantized_rms_norm_spellings_fuse(case):
    _check(case)


@QFUZZ
@given(cases(flawed=True, dtypes=(torch.float32,), onert=True))
def test_quantized_near_misses_do_not_fuse(case):
    _check(case)
