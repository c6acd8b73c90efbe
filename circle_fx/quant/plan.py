"""The quantization plan: what ``export(quantize=..., quant_target=...)`` asked for, resolved and
checked once (before the slow capture), then read by every quantization path of ``lower``.

- weight-only int8 and GGML blocks (``quantize="int8-weights"`` / ``"q8_0"`` / ``"q4_0"`` or a
  :class:`~circle_fx.quant.config.QuantConfig`): :attr:`QuantPlan.weights`, applied after the
  user pipeline by a constant fold and :class:`~circle_fx.quant.weight_only.QuantizeWeights`
  (fusions and any weight merging see float weights; a weight a fusion left as a constant
  expression, conv_batch_norm's ``w * scale``, is one constant named after its parameter by then);
- static quantization (a PT2E-converted model, its Q/DQ nodes): :attr:`QuantPlan.target`
  (``"onert"`` unless given), the Q/DQ passes around the pipeline (:func:`.qdq.bracket`).

Data-free calibration (``QuantConfig(calibration="auto")``, the default, with a Q4_0 linear and
no ``importance``) needs the eager model, so the export calls :meth:`QuantPlan.calibrated` before
the capture: the plan comes back with the importance (:mod:`.datafree`), or with
``calibration_note`` saying why it did not calibrate; ``summary()`` reports either.

The two exclude each other: asking for weight-only quantization of a statically quantized
model is an :class:`~circle_fx.errors.InputError`, as is a ``quant_target`` for a float model.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import InputError
from .config import QuantConfig, resolve_quantize


@dataclass(frozen=True)
class QuantPlan:
    #: the weight-only / GGML configuration (None: weights stay float)
    weights: QuantConfig | None = None
    #: the static quantization target the caller named (None: ``"onert"`` when the model has Q/DQ nodes)
    target: str | None = None

    def calibrated(self, model, why_not: str | None = None, encode=None) -> "QuantPlan":
        """This plan with the data-free Q4_0 importance of ``model`` when its config wants it
        (:attr:`~.config.QuantConfig.wants_calibration`), else itself. ``why_not``: the caller
        knows it cannot run the model (recorded as the reason instead of trying). ``encode``
        (``text -> ids``, the model's tokenizer; else the ``tokenizer.json`` saved beside its
        weights — tokenizer.json or the GGUF —, if any; False: none): calibrate on the built-in corpus (:func:`.datafree.corpus_importance`);
        without one, or when that fails, on seeded random ids (:func:`.datafree.datafree_importance`)."""
        cfg = self.weights
        if cfg is None or not cfg.wants_calibration:
            return self
        if why_not is None:
            from .datafree import corpus_importance, datafree_importance

            if encode is None:
                from .datafree import saved_tokenizer

                encode = saved_tokenizer(model)
            importance, why_corpus = corpus_importance(model, encode) if encode else (None, None)
            if importance is None:
                importance, why_not = datafree_importance(model)
                if importance is not None and why_corpus:
                    importance.source += f" (not the built-in corpus: {why_corpus})"
            if importance is not None:
                return replace(self, weights=replace(cfg, importance=importance))
        return replace(self, weights=replace(cfg, calibration_note=f"not calibrated: {why_not}"))

    def fitted(self, model) -> "QuantPlan":
        """This plan, with a Q8_0 lm_head over Q4_0 linears turned Q4_0 (and a warning) when the
        Q8_0 copy alone would take the file over onert 0.1.0's 2 GiB (:data:`ONERT_FILE_LIMIT`):
        a tied 128k-vocab table, Llama-3.2-3B's, is ~0.42 GB at Q8_0 besides its Q4_0 lookup copy
        (~2.07 GiB in all), and a file onert cannot map is worth less than one more 4-bit matrix.
        An estimate from the parameter shapes (a weightless, streamed model has them too)."""
        cfg = self.weights
        if cfg is None or cfg.weights != "q4_0" or cfg.lm_head_mode != "q8_0":
            return self
        head = getattr(model, "get_output_embeddings", lambda: None)()
        table = getattr(model, "get_input_embeddings", lambda: None)()
        w = getattr(head, "weight", None)
        if w is None:
            return self
        from ..circle.ggml import Q4_0, Q8_0
        from ..circle.runtime import ONERT_FILE_LIMIT

        q4_b, q8_b = Q4_0.bits_per_weight / 8, Q8_0.bits_per_weight / 8  # bytes per weight
        q4 = sum(p.numel() * (q4_b if p.dim() >= 2 else 4.0) for p in model.parameters())
        tied = table is not None and getattr(table, "weight", None) is w
        extra = w.numel() * (q8_b if tied else q8_b - q4_b)  # a second (Q8_0) copy, or Q8_0 instead of Q4_0
        if q4 + extra < 0.97 * ONERT_FILE_LIMIT:
            return self
        import warnings

        warnings.warn(f"quantize: lm_head stored q4_0, not q8_0: with a q8_0 lm_head the file would be "
                      f"~{(q4 + extra) / 2**30:.2f} GiB, which onert 0.1.0 cannot map (2 GiB); at q4_0 "
                      f"~{q4 / 2**30:.2f} GiB", stacklevel=3)
        return replace(self, weights=replace(cfg, lm_head="q4_0"))

    def pipeline(self, program, passes: list, weight_cache: dict | None = None) -> list:
        """``passes`` with the plan's quantization passes around / after it, for ``program``.
        ``weight_cache``: see :func:`circle_fx.lower`."""
        from .qdq import bracket, has_qdq

        passes = bracket(program, passes, self.target)
        if self.weights is None:
            return passes
        if has_qdq(program):
            raise InputError("quantize=... asks for weight-only quantization, but the model is already statically "
                             "quantized (it has quantize/dequantize nodes): export it without quantize=")
        from ..passes import FoldConstants
        from .weight_only import QuantizeWeights

        return [*passes, FoldConstants(), QuantizeWeights(self.weights, cache=weight_cache)]


def quant_plan(quantize=None, quant_target: str | None = None) -> QuantPlan:
    """Resolve ``quantize`` (None / "none", a preset name, a QuantConfig, or a plan made before)
    and check ``quant_target``; a bad value is an InputError here, before any capture."""
    if isinstance(quantize, QuantPlan):
        if quant_target is not None and quant_target != quantize.target:
            raise InputError(f"quant_target={quant_target!r} given with a quantization plan for {quantize.target!r}")
        return quantize
    if quant_target is not None:
        from .qdq import check_target

        check_target(quant_target)
    return QuantPlan(resolve_quantize(quantize), quant_target)
