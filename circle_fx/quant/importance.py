"""Activation importance for block quantization: the mean square of every linear's input columns.

A Q4_0 block has 16 levels, so its scale decides which of its 32 weights are rounded well. The
plain squared error treats all 32 alike, but the output error of ``y = W x`` weighs the error of
column ``j`` by ``E[x_j^2]``: a trained LLM's inputs have a few columns with activations tens of
times larger than the rest, and the scales that minimise the unweighted error round exactly those
columns' weights no better than the others. Weighting the per-block error by ``E[x_j^2]`` is
llama.cpp's "importance matrix"; measured on SmolLM2-135M (``benchmarks/q4_sensitivity.py``),
every linear in Q4_0: +31 % perplexity with the unweighted search, +9 % weighted.

:func:`activation_importance` runs the user's model on calibration samples with a forward
pre-hook on every ``nn.Linear`` (hooks observe, they change nothing; removed afterwards) and
returns an :class:`Importance`, which ``QuantConfig(importance=...)`` takes. The values are keyed
by module name (``model.layers.0.mlp.down_proj``) and by every parameter name of the module's
weight (``lm_head.weight``, and ``model.embed_tokens.weight`` when tied), so the weight
quantization pass finds them under the names it reports.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch
from torch import nn

from ..errors import InputError


class Importance(Mapping):
    """``{name: float32 array [in_features]}``, the mean of ``x^2`` per input column of a linear.

    Hashed by identity (a ``QuantConfig`` holding one stays hashable); built from any mapping of
    names to 1-D non-negative finite values."""

    def __init__(self, values: Mapping, samples: int | None = None, rows: int | None = None):
        self._values = {}
        for name, v in dict(values).items():
            if not isinstance(name, str) or not name:
                raise InputError(f"importance: keys must be non-empty weight or module names, got {name!r}")
            a = np.asarray(v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v, dtype=np.float32)
            if a.ndim != 1 or not a.size:
                raise InputError(f"importance[{name!r}]: expected one value per input column (1-D), "
                                 f"got shape {a.shape}")
            if not np.isfinite(a).all() or (a < 0).any():
                raise InputError(f"importance[{name!r}]: values must be finite and >= 0")
            self._values[name] = a
        #: how many samples / input rows were averaged (None when given directly)
        self.samples, self.rows = samples, rows
        #: what the values were measured on, for ``summary()`` / the CLI (set by whoever measured them)
        self.source = "values given to QuantConfig(importance=...)" if samples is None else \
            f"{samples} sample(s), {rows} rows"
        #: GPTQ's Q4_0 blocks measured on the same samples (:class:`~.gptq_q4.Rounding`), or None:
        #: the export packs them instead of searching each block's scale
        self.rounding = None

    def __getitem__(self, name):
        return self._values[name]

    def __iter__(self):
        return iter(self._values)

    def __len__(self):
        return len(self._values)

    __hash__ = object.__hash__

    def __eq__(self, other):
        return self is other

    def __repr__(self):
        what = f", {self.samples} samples, {self.rows} rows" if self.samples is not None else ""
        return f"Importance({len(self._values)} names{what})"

    def for_weight(self, name: str, cols: int) -> np.ndarray | None:
        """The values for weight ``name`` (a parameter name, or ``a.weight+b.weight`` for a merged
        weight, whose members read one input) with ``cols`` input columns, or None."""
        for part in name.split("+"):
            for key in (part, part.rsplit(".", 1)[0]):
                a = self._values.get(key)
                if a is not None:
                    if a.shape[0] != cols:
                        raise InputError(f"importance[{key!r}] has {a.shape[0]} values but weight {name!r} "
                                         f"has {cols} input columns (importance from another model?)")
                    return a
        return None


def _call(model, sample):
    if isinstance(sample, Mapping):
        return model(**sample)
    if isinstance(sample, tuple):
        return model(*sample)
    return model(sample)


class LinearStats:
    """Forward pre-hooks on every ``nn.Linear`` of ``model`` (names relative to it) that sum ``x^2``
    per input column while the ``with`` block runs (the hooks observe; removed on exit), then
    :meth:`importance`. Shared by :func:`activation_importance` (the caller's samples) and the
    data-free default (:mod:`circle_fx.quant.datafree`: text the model generates)."""

    def __init__(self, model: nn.Module):
        self.aliases: dict[int, list[str]] = {}
        for pname, p in model.named_parameters(remove_duplicate=False):
            self.aliases.setdefault(id(p), []).append(pname)
        self.linears = {name: mod for name, mod in model.named_modules() if isinstance(mod, nn.Linear)}
        if not self.linears:
            raise InputError(f"activation_importance: {type(model).__name__} has no torch.nn.Linear module")
        self.sums: dict[str, list] = {}
        self.hooks: list = []

    def _hook(self, args, name):
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return
        x = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
        acc = self.sums.setdefault(name, [0, 0])
        acc[0] = acc[0] + (x * x).sum(0)
        acc[1] += x.shape[0]

    def __enter__(self):
        for name, mod in self.linears.items():
            self.hooks.append(mod.register_forward_pre_hook(lambda m, a, name=name: self._hook(a, name)))
        return self

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()
        self.hooks = []
        return False

    def importance(self, samples: int | None = None) -> "Importance | None":
        """The mean ``x^2`` per column of every linear that ran (keyed by module name and by every
        parameter name of its weight), or None when none ran."""
        values, rows = {}, 0
        for name, (total, n) in self.sums.items():
            mean = (total / max(n, 1)).to(torch.float32)
            values[name] = mean
            rows = max(rows, n)
            for pname in self.aliases.get(id(self.linears[name].weight), []):
                values.setdefault(pname, mean)
        return Importance(values, samples=samples, rows=rows) if values else None


def activation_importance(model: nn.Module, samples: Iterable, gptq: bool = False) -> Importance:
    """Run ``model`` in eager PyTorch on each of ``samples`` (a tensor such as token ids ``[1, n]``,
    a tuple of positional arguments, or a dict of keyword arguments) and return the mean ``x^2``
    per input column of every ``nn.Linear`` that ran. Use text like what the model will see, and
    not the text you evaluate on; a few thousand tokens are plenty.

    ``gptq``: also round every Q4_0 linear by GPTQ on the same samples (``Importance.rounding``,
    :mod:`circle_fx.quant.gptq_q4`; the model runs once more per chunk of layers): the export
    packs those blocks (the output head keeps the weighted search). Real text only: on random ids
    GPTQ fits their correlations, not text's (docs in :mod:`circle_fx.quant.corpus`)."""
    if not isinstance(model, nn.Module):
        raise InputError(f"activation_importance: model must be a torch.nn.Module, got {type(model).__name__}")
    samples = list(samples) if gptq else samples
    stats = LinearStats(model)
    count = 0
    with torch.no_grad(), stats:
        for i, sample in enumerate(samples):
            try:
                _call(model, sample)
            except Exception as e:  # the user's model on the user's sample: name which one
                raise InputError(f"activation_importance: the model failed on sample {i}: "
                                 f"{type(e).__name__}: {e}") from e
            count += 1
    if not count:
        raise InputError("activation_importance: no samples given")
    imp = stats.importance(samples=count)
    if imp is None:
        raise InputError("activation_importance: no nn.Linear ran on the samples")
    imp.source = f"{count} caller-given sample(s), {imp.rows} rows"
    if gptq:
        from .gptq_q4 import gptq_q4_0_rounding

        # the output head (kept at Q8_0 by the q4_0 preset) of the model or of the LM a wrapper holds
        head = next((m.get_output_embeddings() for m in model.modules()
                     if callable(getattr(m, "get_output_embeddings", None))), None)

        def run():
            for sample in samples:
                _call(model, sample)

        training = model.training
        model.eval()
        try:
            with torch.no_grad():
                imp.rounding = gptq_q4_0_rounding(model, run, skip=[head] if isinstance(head, nn.Module) else [],
                                                  importance=imp)
        finally:
            model.train(training)
        imp.source += f", GPTQ rounding for {len(imp.rounding)} weight(s)"
    return imp
