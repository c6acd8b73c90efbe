"""Torch custom ops for Circle-only operators (``torch.ops.circle.*``).

Fusion passes replace decomposed subgraphs by these ops. Each has a real eager kernel
and a fake (meta) kernel, so a fused FX graph still runs in PyTorch and can be compared
numerically with the graph it came from, and shape propagation keeps working.
"""
from __future__ import annotations

from typing import Optional

import torch

_lib = torch.library.Library("circle", "DEF")  # noqa: keep a reference for the process lifetime
_lib.define("rms_norm(Tensor x, Tensor? weight, float eps) -> Tensor")
_lib.define("rope(Tensor x, Tensor sin, Tensor cos) -> Tensor")


def _rms_norm_eager(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in at least float32, returned in ``x.dtype``.

    Accumulating in float32 is what every real spelling does (Llama, Gemma, T5 cast up
    before the reduction), so doing it here keeps fused half-precision graphs faithful.
    """
    compute = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(compute)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(compute)
    return y.to(x.dtype)


def _rms_norm_fake(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    return torch.empty_like(x)


_lib.impl("rms_norm", _rms_norm_eager, "CompositeExplicitAutograd")
torch.library.register_fake("circle::rms_norm", _rms_norm_fake, lib=_lib)

rms_norm = torch.ops.circle.rms_norm.default


def _rope_eager(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX rotation (transformers' ``rotate_half``) in Circle ROPE's argument order (x, sin, cos)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def _rope_fake(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


_lib.impl("rope", _rope_eager, "CompositeExplicitAutograd")
torch.library.register_fake("circle::rope", _rope_fake, lib=_lib)

rope = torch.ops.circle.rope.default
