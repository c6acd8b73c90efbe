"""summary() lists the widest quantized activation ranges (circle/activation_ranges.py): an
outlier channel in the calibration data shows up as the widest range, at the input it widened."""
from __future__ import annotations

import torch

import circle_fx
from circle_fx.circle.activation_ranges import widest_activation_ranges
from pt2e_util import LinearNormModel, quantize_pt2e


def test_outlier_calibration_is_the_widest_range_in_summary():
    model, x = LinearNormModel(), torch.randn(2, 16)
    g = torch.Generator().manual_seed(0)
    outlier = torch.tensor([50.0] + [1.0] * 15)
    cal = [(torch.randn(2, 16, generator=g) * outlier,) for _ in range(3)]
    cm = circle_fx.export(quantize_pt2e(model, (x,), cal), (x,), quant_target="onert")
    b = cm.builder
    ranges = widest_activation_ranges(b.tensors, lambda i: b.buffers[b.tensors[i].buffer] is not None)
    assert len(ranges) == 5 and ranges == sorted(ranges, key=lambda r: -r.width)
    seen = torch.cat([c[0] for c in cal])
    # the model input's QUANTIZE covers the calibration input, outlier included, and is far wider
    # than the normalised values after the RMSNorm
    first_fc_input = next(r for r in ranges if r.low <= float(seen.min()) + 1e-3 and r.high >= float(seen.max()) - 1e-3)
    assert first_fc_input.width > 10 * ranges[-1].width
    assert all(r.dtype == "uint8" and abs(r.width - 255 * r.step) < 1e-3 * r.width for r in ranges)
    text = cm.summary()
    assert "widest quantized activation ranges" in text and ranges[0].name in text


def test_float_model_lists_no_ranges():
    cm = circle_fx.export(LinearNormModel().eval(), (torch.randn(2, 16),))
    assert "widest quantized activation ranges" not in cm.summary()
