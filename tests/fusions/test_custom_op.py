"""``torch.ops.circle.rms_norm``: the eager kernel is right, the fake kernel keeps shapes,
and a fused FX graph still runs in eager with the same numbers as the graph it came from.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import circle_fx
from circle_fx.fusions.rms_norm import rms_norm
from circle_fx.passes import default_pipeline, run_passes


@pytest.mark.parametrize("shape", [(8,), (3, 8), (2, 5, 8), (2, 3, 4, 8)])
@pytest.mark.parametrize("weighted", [True, False])
def test_eager_matches_torch_rms_norm(shape, weighted):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g)
    w = torch.randn(shape[-1], generator=g) if weighted else None
    got = torch.ops.circle.rms_norm(x, w, 1e-6)
    want = F.rms_norm(x, [shape[-1]], w, 1e-6)
    assert got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_eps_is_used():
    x = torch.full((1, 4), 1e-3)
    loose, tight = torch.ops.circle.rms_norm(x, None, 1e-2), torch.ops.circle.rms_norm(x, None, 0.0)
    torch.testing.assert_close(tight, torch.ones(1, 4))
    torch.testing.assert_close(loose, F.rms_norm(x, [4], None, 1e-2))
    assert (loose < 0.1).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_accumulates_in_float32(dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 5, 64, generator=g) * 30).to(dtype)  # squares overflow fp16 if not upcast
    w = torch.randn(64, generator=g).to(dtype)
    got = torch.ops.circle.rms_norm(x, w, 1e-6)
    assert got.dtype == dtype
    assert torch.isfinite(got).all()
    want = F.rms_norm(x.float(), [64], w.float(), 1e-6).to(dtype)
    torch.testing.assert_close(got, want)


def test_fake_kernel_shapes_and_dtypes():
    with FakeTensorMode():
        x = torch.empty(2, 7, 16, dtype=torch.float16)
        out = torch.ops.circle.rms_norm(x, torch.empty(16, dtype=torch.float16), 1e-5)
        assert out.shape == (2, 7, 16) and out.dtype == torch.float16
        out = torch.ops.circle.rms_norm(torch.empty(3, 16), None, 1e-5)
        assert out.shape == (3, 16) and out.dtype == torch.float32


def test_opcheck_schema_fake_and_dispatch():
    x, w = torch.randn(2, 3, 8), torch.randn(8)
    for args in [(x, w, 1e-6), (x, None, 1e-6)]:
        results = torch.library.opcheck(rms_norm, args)
        assert all(v == "SUCCESS" for v in results.values()), results


def test_custom_op_survives_torch_export_and_lowers_to_rms_norm():
    """Users can call the op directly; torch.export keeps it and it lowers 1:1."""

    class Direct(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8))

        def forward(self, x):
            return torch.ops.circle.rms_norm(x, self.w, 1e-5)

    model, x = Direct(), torch.randn(2, 3, 8)
    cm = circle_fx.export(model, (x,))
    assert dict(cm.op_histogram()) == {"RMS_NORM": 1}
    (got,) = cm.run(x)
    torch.testing.assert_close(torch.tensor(got), model(x).detach(), rtol=0, atol=1e-5)


def _fused_vs_original(model, inputs):
    original = circle_fx.capture(model, inputs)
    expected = original.run(*inputs)
    fused = circle_fx.capture(model, inputs)
    run_passes(fused, default_pipeline())
    return original, expected, fused, fused.run(*inputs)


def test_fused_llama_graph_runs_in_eager_like_the_original(tiny_llama):
    model, inputs = tiny_llama
    original, expected, fused, got = _fused_vs_original(model, inputs)
    targets = [n.target for n in fused.graph.nodes if n.op == "call_function"]
    assert targets.count(rms_norm) == 5
    assert rms_norm not in [n.target for n in original.graph.nodes]
    assert torch.ops.aten.rsqrt.default not in targets
    assert len(got) == len(expected) == 1
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(got[0], model(*inputs).logits, rtol=0, atol=1e-5)


def test_fused_half_precision_graph_matches_original():
    """The fused node keeps the original's up-cast: fp16 in, fp16 out, same values."""

    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(32).half())

        def forward(self, x):
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.weight * h.to(x.dtype)

    x = (torch.randn(2, 4, 32) * 10).half()
    _, expected, fused, got = _fused_vs_original(Norm(), (x,))
    assert [n.target for n in fused.graph.nodes].count(rms_norm) == 1
    assert got[0].dtype == torch.float16
    torch.testing.assert_close(got[0], expected[0])
