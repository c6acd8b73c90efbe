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


def _report(big: float):
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from circle_fx.quant import CircleQuantizer
    from circle_fx.quant.report import quantization_report

    model, x = LinearNormModel(), torch.randn(2, 16)
    with torch.no_grad():  # like a trained LLM, the weights nearly ignore the outlier channel
        model.fc.weight[:, 0] *= 0.01
    g = torch.Generator().manual_seed(0)
    outlier = torch.tensor([big] + [1.0] * 15)
    cal = [(torch.randn(2, 16, generator=g) * outlier,) for _ in range(4)]
    prepared = prepare_pt2e(torch.export.export(model.eval(), (x,)).module(), CircleQuantizer(skip=()))
    with torch.no_grad():
        for b in cal:
            prepared(*b)
    before = {k: v.clone() for k, v in prepared.state_dict().items()}
    report = quantization_report(prepared, cal[:2])
    assert all(torch.equal(before[k], v) for k, v in prepared.state_dict().items())  # observers untouched
    prepared.report = report
    return prepared


def test_report_shows_the_outlier_input_and_its_linear():
    """quantization_report on the prepared model: an outlier channel in the calibration input
    makes the input's range the widest and costs the linear reading it > 10 dB of SQNR
    against float (the same model calibrated without the outlier), and it is the worst layer."""
    plain, bad = _report(1.0).report, _report(300.0).report
    for r in (plain, bad):
        assert sorted(e.name for e in r.layers) == ["fc", "fc2"]
    sq = {k: {e.name: e.sqnr_db for e in r.layers} for k, r in (("plain", plain), ("bad", bad))}
    assert sq["bad"]["fc"] < sq["plain"]["fc"] - 10 and sq["bad"]["fc"] < sq["bad"]["fc2"], sq
    assert max(bad.ranges, key=lambda r: r.width).name == "x"  # a model input: no module path
    assert max(bad.ranges, key=lambda r: r.width).width > 100 * 2
    text = str(bad)
    assert "lowest SQNR" in text and "fc:" in text and "widest calibrated activation ranges" in text


def test_export_keeps_the_report_for_summary():
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    prepared = _report(300.0)
    x = torch.randn(2, 16)
    cm = circle_fx.export(convert_pt2e(prepared), (x,), quant_target="onert", quant_report=prepared.report)
    text = cm.summary()
    assert "lowest SQNR" in text and "  fc: " in text and "widest quantized activation ranges" in text
