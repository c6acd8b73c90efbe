"""Quantized export, two flows.

- Weight-only (``weight_only``): ``circle_fx.export(model, inputs, quantize="int8-weights")``
  or a :class:`QuantConfig`: int8 weights with float activations.
- Static quantization (PT2E): :class:`CircleQuantizer` annotates a ``torch.export``-ed model
  for ``torchao.quantization.pt2e`` (``prepare_pt2e`` -> calibrate -> ``convert_pt2e``);
  ``circle_fx.export(converted, inputs, quant_target="onert" | "npu")`` then turns the
  quantize/dequantize nodes into Circle quantization (:mod:`circle_fx.quant.qdq`).
  ``qops`` holds the quantized torch custom ops those passes produce. SmoothQuant
  (:mod:`circle_fx.quant.smooth`, ``CircleQuantizer(smooth_quant=alpha, calibration=...)``)
  moves activation outliers into the weights before annotation.
- Activation importance (:mod:`circle_fx.quant.importance`): ``activation_importance(model,
  samples)`` -> ``QuantConfig(importance=...)`` weights the Q4_0 block scales by what each input
  column carries.

``Importance``/``activation_importance`` (torch) are imported on first use, as is the quantizer:
it needs torchao (``pip install circle-fx[quant]``); it is imported on first use
so that ``import circle_fx`` never requires it.
"""
from .config import QuantConfig, resolve_quantize


def __getattr__(name):  # importance and pt2e need torch; the CLI reads config/options without it
    if name in ("Importance", "activation_importance"):
        from . import importance

        return getattr(importance, name)
    if name == "CircleQuantizer":
        from .pt2e import CircleQuantizer

        return CircleQuantizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CircleQuantizer", "Importance", "QuantConfig", "activation_importance", "resolve_quantize"]
