"""RMSNorm written with a re-added dim or with ``linalg.vector_norm``.

Genuine RMSNorms fuse to one RMS_NORM: ``mean(-1)[..., None]`` / ``.unsqueeze(-1)`` is
``keepdim=True``; ``x / (vector_norm(x) * D**-0.5)`` is an RMSNorm with epsilon 0;
``x * rsqrt(vector_norm(x)**2 / D + eps)`` is one with epsilon ``eps``.
Not RMSNorm, so never fused, but exported and matching: epsilon outside the root
(``x / (rms + eps)``, ``x / (norm + eps)``), ``F.normalize`` (``x / max(norm, eps)``), and a
mean whose dim is never re-added (it broadcasts along the wrong axis).
Every case runs in onert against eager (rtol=atol=1e-5).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from onert_eager import Fn, assert_onert_matches_eager

D = 16
W = torch.linspace(0.5, 1.5, D)


def _vn(x):
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True)


FUSE = {
    "mean_index_none": lambda x: x * torch.rsqrt(x.pow(2).mean(-1)[..., None] + 1e-6) * W,
    "mean_unsqueeze": lambda x: x * torch.rsqrt(x.pow(2).mean(-1).unsqueeze(-1) + 1e-6) * W,
    "sum_div_unsqueeze": lambda x: x * torch.rsqrt((x.pow(2).sum(-1) / D).unsqueeze(-1) + 1e-5) * W,
    "mean_view": lambda x: x * torch.rsqrt(x.pow(2).mean(-1).view(*x.shape[:-1], 1) + 1e-6) * W,
    "vector_norm_times_rsqrt_d": lambda x: x / (_vn(x) * D ** -0.5) * W,
    "vector_norm_squared_over_d": lambda x: x * torch.rsqrt(_vn(x).pow(2) / D + 1e-6) * W,
}
NOT_RMS = {
    "vector_norm_eps_outside_root": lambda x: x / (_vn(x) * D ** -0.5 + 1e-6) * W,
    "norm_plus_eps": lambda x: x / (_vn(x) + 1e-6) * W,
    "f_normalize_sqrt_d": lambda x: F.normalize(x, dim=-1) * math.sqrt(D) * W,
    "mean_never_readded": lambda x: x * torch.rsqrt(x.pow(2).mean(-1) + 1e-6),  # rows == D: wrong axis
}


def _x(seed=0):
    return torch.randn(1, D, D, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(FUSE))
def test_genuine_rms_norm_forms_fuse(name):
    cm = assert_onert_matches_eager(Fn(FUSE[name]), (_x(),), rtol=1e-5, atol=1e-5)
    hist = cm.op_histogram()
    assert hist["RMS_NORM"] == 1 and hist["RSQRT"] == 0 and hist["SQRT"] == 0, cm.summary()


@pytest.mark.parametrize("name", list(NOT_RMS))
def test_forms_that_are_not_rms_norm_export_unfused(name):
    cm = assert_onert_matches_eager(Fn(NOT_RMS[name]), (_x(1),), rtol=1e-5, atol=1e-5)
    assert cm.op_histogram()["RMS_NORM"] == 0, cm.summary()
