"""The static (PT2E) flow in one call, for the CLI (``circle-fx export --static``): export,
``prepare_pt2e`` with :class:`~circle_fx.quant.pt2e.CircleQuantizer`, calibrate, take the
quantization report (widest ranges, per-linear SQNR against float: :mod:`.report`) while the
observers are live, ``convert_pt2e``. Python users call the same torchao steps themselves
(README); this only saves the CLI from repeating them.
"""
from __future__ import annotations

import torch


def quantize_static(model, example_inputs, calibration=None, quantizer=None, report_batches: int = 2):
    """``(converted, report)``: ``model`` quantized by ``quantizer`` (default
    ``CircleQuantizer()``) calibrated on ``calibration`` (input tuples; default: the example
    inputs), and the :class:`~circle_fx.quant.report.QuantizationReport` measured on the first
    ``report_batches`` of them."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from .pt2e import CircleQuantizer
    from .report import quantization_report

    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    calibration = [inputs] if calibration is None else [b if isinstance(b, (tuple, list)) else (b,)
                                                         for b in calibration]
    module = model.eval() if isinstance(model, torch.nn.Module) else model
    gm = torch.export.export(module, inputs, strict=False).module()
    prepared = prepare_pt2e(gm, quantizer or CircleQuantizer())
    with torch.no_grad():
        for batch in calibration:
            prepared(*batch)
    report = quantization_report(prepared, calibration[:report_batches])
    return convert_pt2e(prepared), report
