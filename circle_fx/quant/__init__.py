"""Quantized export. ``weight_only``: int8 weights with float activations (``quantize="int8-weights"``)."""
from .config import QuantConfig, resolve_quantize

__all__ = ["QuantConfig", "resolve_quantize"]
