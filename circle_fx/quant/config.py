"""What to quantize: :class:`QuantConfig`, or a shorthand string (``"int8-weights"``, ``"q8_0"``, ``"q4_0"``).

A typed object rather than free-form strings because a typo in a quantization option
would otherwise silently give a float model; every field is checked when it is built and
a wrong value is an :class:`~circle_fx.errors.InputError` listing the accepted ones.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..errors import InputError

#: linear weights: ``int8`` symmetric with one scale per output row (onert's hybrid FC), or GGML
#: blocks of 32 with a float16 scale each (``q8_0``: 8.5 bits/weight, ``q4_0``: 4.5)
WEIGHT_MODES = ("int8", "q8_0", "q4_0")
#: the GGML weight modes (FULLY_CONNECTED with a GGML_* weight; in_features must be a multiple of 32)
GGML_MODES = ("q8_0", "q4_0")
#: embedding tables: uint8 rows (q + 128, zero point 128) with a float scale per row, or a GGML
#: Q4_0 table that GATHER reads directly (onert has no Q8_0 GATHER)
EMBEDDING_MODES = ("uint8-rows", "q4_0")
#: ``lm_head`` (the linear tied to the embedding, or named ``lm_head``): same mode as ``weights``
LM_HEAD_AUTO = "auto"
#: the linears a ``QuantConfig(sensitive=...)`` mix keeps at more bits, besides the first/last
#: ``end_layers``: the MLP's output projection (Llama/Qwen/Mistral ``down_proj``, GPT-2's ``mlp.c_proj``,
#: OPT-like ``fc2``, Meta-Llama's ``feed_forward.w2``, GPT-NeoX's ``dense_4h_to_h``). llama.cpp's
#: Q4_K_M keeps ``ffn_down`` at more bits for the same reason; on SmolLM2-135M it was the most
#: sensitive linear (benchmarks/README.md, quant_accuracy.py). Unlike ``overrides`` a model without
#: such names is not an error.
#: ``QuantConfig.blocks_from_rows``' default: an ``int8`` linear with at least this many static rows
#: is stored as ``q8_0`` blocks. Measured (benchmarks/onert_prefill_forms.py, docs/onert-findings.md
#: "Linear forms by row count"): the benchmark Llama's 48 layer linears at 16 rows took 196 ms as
#: ggml's Q8_0 FULLY_CONNECTED vs 290-355 ms as onert's hybrid int8 one, at 128 rows 1300 vs 2690 ms
#: (0.5x), dequantize-then-CONV_2D 3700-4000 ms; at one row (decode) the two kernels are even.
BLOCKS_FROM_ROWS = 16
SENSITIVE_LINEARS = ("*.mlp.down_proj", "*.mlp.c_proj", "*.fc2", "*.feed_forward.w2", "*.mlp.dense_4h_to_h")
#: ``QuantConfig.calibration``'s default: Q4_0 importance from the model run on seeded random ids
#: (:mod:`circle_fx.quant.datafree`) when no ``importance`` is given and the model is in memory
CALIBRATION_AUTO = "auto"
#: shorthand strings accepted by ``export(..., quantize=...)`` and ``--quantize``, and what they mean
PRESETS = {
    "int8-weights": dict(weights="int8", embedding="uint8-rows"),
    # 8-bit embedding rows: a Q4_0 table would cost more accuracy than every Q8_0 linear together
    "q8_0": dict(weights="q8_0", embedding="uint8-rows"),
    # every linear Q4_0 but the lm_head (Q8_0, as llama.cpp keeps ``output.weight`` at Q6_K for Q4_0: alone it
    # halves the loss, +32 % -> +17.5 % on SmolLM2-135M; a tied table is then stored twice, Q8_0 for the
    # linear and Q4_0 for GATHER); Q4_0 scales weighted by data-free calibration (CALIBRATION_AUTO)
    "q4_0": dict(weights="q4_0", embedding="q4_0", lm_head="q8_0"),
    # Q4_0 with the sensitive tensors at Q8_0 (lm_head, MLP output projections, first/last 2 layers):
    # measured on SmolLM2-135M in onert +3.7 % perplexity at 126 MB vs q4_0's +32 % at 77 MB, but
    # decode 0.39x float on the 12-layer 125M benchmark model vs q4_0's 0.32x (benchmarks/README.md)
    "q4_0-mix": dict(weights="q4_0", embedding="q4_0", lm_head="q8_0", sensitive="q8_0", end_layers=2),
}


@dataclass(frozen=True)
class QuantConfig:
    """Weight-only quantization: activations stay float32.

    - ``weights``: ``"int8"`` quantizes every linear weight (FULLY_CONNECTED) to int8 with a
      float scale per output channel; ``None`` keeps them float.
    - ``embedding``: ``"uint8-rows"`` stores embedding tables as uint8 with a scale per row
      (GATHER -> DEQUANTIZE -> MUL in the file); ``None`` keeps them float.
    - ``lm_head``: the output projection's mode (the linear whose weight is tied to the embedding,
      or whose module is named ``lm_head``): ``"auto"`` (as ``weights``), one of ``WEIGHT_MODES``,
      or None (float). A tied weight is stored once when both uses share an encoding (int8 +
      uint8-rows, q4_0 + q4_0), else once per encoding.
    - ``skip``: glob patterns (``fnmatch``) of weights to keep float, matched against the
      parameter name (``lm_head.weight``) and its module name (``lm_head``); a pattern that
      matches no quantizable weight is an error (it is almost certainly a typo).
    - ``overrides``: ``{pattern: mode}`` (or pairs), the linear weight mode (one of
      ``WEIGHT_MODES``, or None for float) of the weights a glob pattern matches, names as for
      ``skip``; the first matching pattern wins, over ``weights`` and ``lm_head``. For mixed
      precision measured per tensor, e.g. ``{"*.mlp.down_proj": "q8_0"}`` with ``weights="q4_0"``
      (llama.cpp's Q4_K_M keeps ``ffn_down`` at higher precision likewise). Merged weights
      (``merge_linears``: q/k/v, gate/up) match when any member does. A convolution weight follows its
      override too (None: float; any mode: int8 per channel). An unmatched pattern is an error.
    - ``sensitive``: the mode (one of ``WEIGHT_MODES``) of the linears quantization hurts most:
      those ``SENSITIVE_LINEARS`` names, and every linear of the first and last ``end_layers``
      decoder layers (a layer is the first number after a dotted name, ``model.layers.<i>``,
      ``transformer.h.<i>``; the count is the largest index + 1). None: they follow ``weights``. ``overrides`` win over it,
      it wins over ``weights``; ``lm_head`` has its own field.
    - ``blocks_from_rows``: an ``int8`` linear whose input has a static row count (product of its
      leading dims) of at least this many rows is stored as ``q8_0`` blocks instead: at 16-128 rows
      (an LLM's prefill) onert's ggml Q8_0 kernel runs in about half the time of its hybrid int8
      FULLY_CONNECTED (``BLOCKS_FROM_ROWS``), and Q8_0 blocks are at least as accurate (a scale per
      32 weights). One row (decode) keeps int8 rows. A weight also read as an embedding table keeps
      int8 (one shared buffer). None: int8 rows at every row count, so the file has no GGML tensor
      and runs where onert's ggml kernels cannot (CPUs without AVX-512).
    - ``importance``: the mean square of each linear's input columns on calibration text
      (:func:`circle_fx.quant.activation_importance`, or any ``{weight or module name: values}``):
      Q4_0 scales then minimise each block's error weighted by it (llama.cpp's importance
      matrix), which is what matters for ``W x``. Measured on SmolLM2-135M: the difference
      between +31 % and +9 % perplexity with every linear Q4_0 (docs: README "Quantization").
      Q8_0 and int8 ignore it (their rounding is fine enough); a Q4_0 linear it has no values for
      gets the plain search, listed by ``summary()``.
    - ``calibration``: where Q4_0 importance comes from when ``importance`` is None. ``"auto"``
      (``CALIBRATION_AUTO``): data-free, from the model run on 2 x 128 seeded random token ids
      (:mod:`circle_fx.quant.datafree`: a few seconds for a 135M model), run by the export when a
      linear is Q4_0 and the model is a transformers causal LM in memory; a weightless model
      (weights streamed from a checkpoint by ``export_llm``) or any other model gets the plain
      search, and ``summary()`` says why. None: never calibrate (the plain search, ggml's bytes
      where they are best). Measured on SmolLM2-135M (benchmarks/README.md): every linear Q4_0 and
      lm_head Q8_0, +17.5 % perplexity plain, within 1.3x of calibrated text's loss with "auto".
    - ``calibration_note``: set by the export, not by you: why ``"auto"`` did not calibrate
      (shown by ``summary()``).
    """

    weights: str | None = "int8"
    embedding: str | None = "uint8-rows"
    skip: tuple[str, ...] = ()
    lm_head: str | None = LM_HEAD_AUTO
    overrides: tuple[tuple[str, str | None], ...] = ()
    sensitive: str | None = None
    end_layers: int = 0
    blocks_from_rows: int | None = BLOCKS_FROM_ROWS
    importance: Mapping | None = None
    calibration: str | None = CALIBRATION_AUTO
    calibration_note: str | None = None

    @property
    def uses_q4_0(self) -> bool:
        """Some linear may be stored Q4_0 (the modes that read ``importance``)."""
        return "q4_0" in (self.weights, self.lm_head_mode, self.sensitive, *(m for _, m in self.overrides))

    @property
    def wants_calibration(self) -> bool:
        """The export should run the data-free calibration: ``"auto"``, no importance given, a Q4_0 linear."""
        return self.calibration == CALIBRATION_AUTO and self.importance is None and self.uses_q4_0

    @property
    def lm_head_mode(self) -> str | None:
        """The lm_head's weight mode with ``"auto"`` resolved."""
        return self.weights if self.lm_head == LM_HEAD_AUTO else self.lm_head

    def __post_init__(self):
        if self.weights not in (None, *WEIGHT_MODES):
            raise InputError(f"QuantConfig(weights={self.weights!r}): expected one of "
                             f"{', '.join(map(repr, WEIGHT_MODES))} or None")
        if self.embedding not in (None, *EMBEDDING_MODES):
            raise InputError(f"QuantConfig(embedding={self.embedding!r}): expected one of "
                             f"{', '.join(map(repr, EMBEDDING_MODES))} or None")
        if self.lm_head not in (None, LM_HEAD_AUTO, *WEIGHT_MODES):
            raise InputError(f"QuantConfig(lm_head={self.lm_head!r}): expected {LM_HEAD_AUTO!r}, one of "
                             f"{', '.join(map(repr, WEIGHT_MODES))} or None")
        if self.sensitive not in (None, *WEIGHT_MODES):
            raise InputError(f"QuantConfig(sensitive={self.sensitive!r}): expected one of "
                             f"{', '.join(map(repr, WEIGHT_MODES))} or None")
        if not isinstance(self.end_layers, int) or isinstance(self.end_layers, bool) or self.end_layers < 0:
            raise InputError(f"QuantConfig(end_layers={self.end_layers!r}): expected an int >= 0")
        if self.blocks_from_rows is not None and (not isinstance(self.blocks_from_rows, int)
                                                  or isinstance(self.blocks_from_rows, bool)
                                                  or self.blocks_from_rows < 1):
            raise InputError(f"QuantConfig(blocks_from_rows={self.blocks_from_rows!r}): expected an int >= 1 or None")
        skip = (self.skip,) if isinstance(self.skip, str) else self.skip
        try:
            skip = tuple(skip)
        except TypeError:
            raise InputError(f"QuantConfig(skip={self.skip!r}): expected a list of name patterns") from None
        bad = [s for s in skip if not isinstance(s, str) or not s]
        if bad:
            raise InputError(f"QuantConfig(skip=...): patterns must be non-empty strings, got {bad!r}")
        object.__setattr__(self, "skip", skip)
        overrides = self.overrides.items() if isinstance(self.overrides, dict) else self.overrides
        try:
            overrides = tuple((p, m) for p, m in overrides)
        except (TypeError, ValueError):
            raise InputError(f"QuantConfig(overrides={self.overrides!r}): expected {{pattern: mode}}") from None
        bad = [(p, m) for p, m in overrides if not isinstance(p, str) or not p or m not in (None, *WEIGHT_MODES)]
        if bad:
            raise InputError(f"QuantConfig(overrides=...): {bad!r}: patterns must be non-empty strings and modes "
                             f"one of {', '.join(map(repr, WEIGHT_MODES))} or None")
        object.__setattr__(self, "overrides", overrides)
        if self.calibration not in (None, CALIBRATION_AUTO):
            raise InputError(f"QuantConfig(calibration={self.calibration!r}): expected {CALIBRATION_AUTO!r} "
                             "(data-free: text the model generates) or None (no calibration); calibration text "
                             "goes in importance=circle_fx.quant.activation_importance(model, samples)")
        if self.importance is not None:
            from .importance import Importance  # torch: imported here, not with this module (the CLI reads it)

            if not isinstance(self.importance, Importance):
                if not isinstance(self.importance, Mapping):
                    raise InputError(f"QuantConfig(importance=...): expected circle_fx.quant.activation_importance"
                                     f"(...) or a {{name: values}} mapping, got {type(self.importance).__name__}")
                object.__setattr__(self, "importance", Importance(self.importance))
        if self.weights is None and self.embedding is None:
            raise InputError("QuantConfig(weights=None, embedding=None) quantizes nothing; "
                             "pass quantize=None for a float model")


def resolve_quantize(quantize) -> QuantConfig | None:
    """``export(quantize=...)``: None / "none" -> no quantization, a preset name (``PRESETS``) -> its
    :class:`QuantConfig`, a QuantConfig as is; anything else is an InputError."""
    if quantize is None or quantize is False or quantize == "none":
        return None
    if isinstance(quantize, QuantConfig):
        return quantize
    if isinstance(quantize, str) and quantize in PRESETS:
        return QuantConfig(**PRESETS[quantize])
    raise InputError(f"quantize={quantize!r}: expected one of {', '.join(map(repr, PRESETS))}, "
                     "a circle_fx.QuantConfig, or None")


#: how the command line spells a float (unquantized) linear or embedding
FLOAT = "float"


def _mode(value: str, accepted, what: str):
    if value == FLOAT:
        return None
    if value not in accepted:
        raise InputError(f"{what}: mode {value!r}: expected one of {', '.join(map(repr, (*accepted, FLOAT)))}")
    return value


def parse_override(text: str) -> tuple[str, str | None]:
    """``--override PATTERN=MODE`` -> ``(pattern, mode)``; MODE one of ``WEIGHT_MODES`` or ``float``.
    The last ``=`` splits, so a pattern may not contain one (no parameter name does)."""
    pattern, sep, mode = text.rpartition("=")
    if not sep or not pattern.strip() or not mode.strip():
        raise InputError(f"--override {text!r}: expected PATTERN=MODE, e.g. '*.mlp.down_proj=q8_0'")
    return pattern.strip(), _mode(mode.strip(), WEIGHT_MODES, f"--override {text!r}")


def from_options(quantize: str | None, overrides=(), embedding: str | None = None,
                 lm_head: str | None = None, int8_rows: bool = False) -> QuantConfig | str | None:
    """The command lines' ``--quantize PRESET [--override PATTERN=MODE ...] [--embedding MODE]
    [--lm-head MODE] [--int8-rows]``: the preset, changed by the other options (``float`` keeps that
    part float; ``--int8-rows``: ``blocks_from_rows=None``).
    Without the other options the preset name is returned as is; they are an error without
    ``--quantize`` (there is nothing to refine)."""
    extra = [f for f, v in (("--override", overrides), ("--embedding", embedding), ("--lm-head", lm_head),
                            ("--int8-rows", int8_rows)) if v]
    if quantize is None or quantize == "none":
        if extra:
            raise InputError(f"{', '.join(extra)} refine a --quantize preset; pass --quantize too")
        return None
    if not extra:
        return quantize
    if quantize not in PRESETS:
        raise InputError(f"--quantize {quantize!r}: expected one of {', '.join(map(repr, PRESETS))}")
    cfg = QuantConfig(**PRESETS[quantize])
    changes = {}
    if overrides:
        changes["overrides"] = tuple(parse_override(o) for o in overrides)
    if embedding:
        changes["embedding"] = _mode(embedding, EMBEDDING_MODES, "--embedding")
    if lm_head:
        changes["lm_head"] = _mode(lm_head, (LM_HEAD_AUTO, *WEIGHT_MODES), "--lm-head")
    if int8_rows:
        changes["blocks_from_rows"] = None
    return replace(cfg, **changes)
