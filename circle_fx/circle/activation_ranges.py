"""The widest quantized activation ranges of a model, from its quantization parameters alone.

A statically quantized tensor's representable range is ``scale * (qmax - qmin)``; its step is
``scale``. A calibration that met an outlier channel (a trained LLM's residual stream spans
~25,000) shows up here as a range orders of magnitude wider than the others, i.e. a uint8
step of ~100: visible in ``summary()`` and ``inspect`` before anything is deployed. Constant
tensors (weights) are left out: their range is the weights', not a calibration's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .schema import CIRCLE_TO_NUMPY


@dataclass(frozen=True)
class ActivationRange:
    name: str
    dtype: str
    low: float
    high: float
    step: float

    @property
    def width(self) -> float:
        return self.high - self.low


def widest_activation_ranges(tensors, is_constant, top: int = 5) -> list[ActivationRange]:
    """The ``top`` widest per-tensor-quantized, non-constant tensors. ``tensors``: objects
    with ``name``, ``type`` (Circle TensorType) and ``quantization`` (``QuantParams`` or
    None); ``is_constant(i)``: whether tensor ``i`` holds data."""
    found = {}
    for i, t in enumerate(tensors):
        q = t.quantization
        dt = CIRCLE_TO_NUMPY.get(t.type)
        if q is None or len(q.scale) != 1 or dt is None or dt.kind not in "iu" or is_constant(i):
            continue
        info = np.iinfo(dt)
        s, z = q.scale[0], q.zero_point[0]
        r = ActivationRange(t.name, dt.name, s * (info.min - z), s * (info.max - z), s)
        # a QUANTIZE/op pair may repeat one range under two names: keep the first name of a range
        found.setdefault((r.dtype, round(r.low, 6), round(r.high, 6)), r)
    return sorted(found.values(), key=lambda r: -r.width)[:top]


def range_lines(ranges: list[ActivationRange]) -> list[str]:
    if not ranges:
        return []
    lines = ["widest quantized activation ranges (a step far above the others means an outlier set the scale):"]
    lines += [f"  {r.name}: {r.dtype} [{r.low:.4g}, {r.high:.4g}] step {r.step:.4g}" for r in ranges]
    return lines
