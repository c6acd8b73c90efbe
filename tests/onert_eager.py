"""The one onert-vs-eager check shared by the op-level end-to-end tests.

Export ``module`` with circle_fx, run the Circle model in onert (the real runtime) and
compare every output with torch eager: same count, same shapes, integer outputs exactly,
float outputs within the caller's tolerance (each test states the one its ops justify).
"""
from __future__ import annotations

import numpy as np
import torch

import circle_fx


class Fn(torch.nn.Module):
    """A module whose forward is ``fn``: one-line models for op-level tests."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def randn(*shape, seed: int = 0) -> torch.Tensor:
    """Seeded inputs, independent of what ran before (the global RNG would make a test's
    values depend on test order)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def assert_onert_matches_eager(module, inputs, *, rtol: float, atol: float, **export_kwargs):
    """Export ``module`` on ``inputs``, run it in onert, compare with eager; return the CircleModel."""
    inputs = tuple(inputs)
    module.eval()
    with torch.no_grad():
        ref = module(*inputs)
    refs = tuple(ref) if isinstance(ref, (tuple, list)) else (ref,)
    cm = circle_fx.export(module, inputs, **export_kwargs)
    outs = cm.run(*inputs)
    assert len(outs) == len(refs), (len(outs), len(refs))
    for i, (out, r) in enumerate(zip(outs, refs)):
        r = r.detach().numpy()
        assert out.shape == r.shape, f"output {i}: shape {out.shape} != eager {r.shape}"
        if r.dtype.kind in "iub":
            np.testing.assert_array_equal(out.astype(r.dtype), r, err_msg=f"output {i}")
        else:
            np.testing.assert_allclose(out, r, rtol=rtol, atol=atol, err_msg=f"output {i}")
    return cm
