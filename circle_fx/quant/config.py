"""What to quantize: :class:`QuantConfig`, or the shorthand string ``"int8-weights"``.

A typed object rather than free-form strings because a typo in a quantization option
would otherwise silently give a float model; every field is checked when it is built and
a wrong value is an :class:`~circle_fx.errors.InputError` listing the accepted ones.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError

#: linear weights: int8 symmetric, one scale per output row (the only ``weights`` mode)
WEIGHT_MODES = ("int8",)
#: embedding tables: uint8 rows (q + 128, zero point 128) with a float scale per row
EMBEDDING_MODES = ("uint8-rows",)
#: shorthand strings accepted by ``export(..., quantize=...)`` and ``--quantize``
PRESETS = ("int8-weights",)


@dataclass(frozen=True)
class QuantConfig:
    """Weight-only quantization: activations stay float32.

    - ``weights``: ``"int8"`` quantizes every linear weight (FULLY_CONNECTED) to int8 with a
      float scale per output channel; ``None`` keeps them float.
    - ``embedding``: ``"uint8-rows"`` stores embedding tables as uint8 with a scale per row
      (GATHER -> DEQUANTIZE -> MUL in the file); ``None`` keeps them float.
    - ``skip``: glob patterns (``fnmatch``) of weights to keep float, matched against the
      parameter name (``lm_head.weight``) and its module name (``lm_head``); a pattern that
      matches no quantizable weight is an error (it is almost certainly a typo).
    """

    weights: str | None = "int8"
    embedding: str | None = "uint8-rows"
    skip: tuple[str, ...] = ()

    def __post_init__(self):
        if self.weights not in (None, *WEIGHT_MODES):
            raise InputError(f"QuantConfig(weights={self.weights!r}): expected one of "
                             f"{', '.join(map(repr, WEIGHT_MODES))} or None")
        if self.embedding not in (None, *EMBEDDING_MODES):
            raise InputError(f"QuantConfig(embedding={self.embedding!r}): expected one of "
                             f"{', '.join(map(repr, EMBEDDING_MODES))} or None")
        skip = (self.skip,) if isinstance(self.skip, str) else self.skip
        try:
            skip = tuple(skip)
        except TypeError:
            raise InputError(f"QuantConfig(skip={self.skip!r}): expected a list of name patterns") from None
        bad = [s for s in skip if not isinstance(s, str) or not s]
        if bad:
            raise InputError(f"QuantConfig(skip=...): patterns must be non-empty strings, got {bad!r}")
        object.__setattr__(self, "skip", skip)
        if self.weights is None and self.embedding is None:
            raise InputError("QuantConfig(weights=None, embedding=None) quantizes nothing; "
                             "pass quantize=None for a float model")


def resolve_quantize(quantize) -> QuantConfig | None:
    """``export(quantize=...)``: None / "none" -> no quantization, "int8-weights" -> the
    default :class:`QuantConfig`, a QuantConfig as is; anything else is an InputError."""
    if quantize is None or quantize is False or quantize == "none":
        return None
    if isinstance(quantize, QuantConfig):
        return quantize
    if isinstance(quantize, str) and quantize in PRESETS:
        return QuantConfig()
    raise InputError(f"quantize={quantize!r}: expected one of {', '.join(map(repr, PRESETS))}, "
                     "a circle_fx.QuantConfig, or None")
