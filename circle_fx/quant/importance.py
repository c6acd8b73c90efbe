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


def activation_importance(model: nn.Module, samples: Iterable) -> Importance:
    """Run ``model`` in eager PyTorch on each of ``samples`` (a tensor such as token ids ``[1, n]``,
    a tuple of positional arguments, or a dict of keyword arguments) and return the mean ``x^2``
    per input column of every ``nn.Linear`` that ran. Use text like what the model will see, and
    not the text you evaluate on; a few thousand tokens are plenty."""
    if not isinstance(model, nn.Module):
        raise InputError(f"activation_importance: model must be a torch.nn.Module, got {type(model).__name__}")
    aliases: dict[int, list[str]] = {}
    for pname, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(pname)
    sums: dict[str, list] = {}
    hooks = []

    def hook(mod, args, name):
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return
        x = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
        acc = sums.setdefault(name, [0, 0])
        acc[0] = acc[0] + (x * x).sum(0)
        acc[1] += x.shape[0]

    linears = {name: mod for name, mod in model.named_modules() if isinstance(mod, nn.Linear)}
    if not linears:
        raise InputError(f"activation_importance: {type(model).__name__} has no torch.nn.Linear module")
    for name, mod in linears.items():
        hooks.append(mod.register_forward_pre_hook(lambda m, a, name=name: hook(m, a, name)))
    count = 0
    try:
        with torch.no_grad():
            for i, sample in enumerate(samples):
                try:
                    _call(model, sample)
                except Exception as e:  # the user's model on the user's sample: name which one
                    raise InputError(f"activation_importance: the model failed on sample {i}: "
                                     f"{type(e).__name__}: {e}") from e
                count += 1
    finally:
        for h in hooks:
            h.remove()
    if not count:
        raise InputError("activation_importance: no samples given")
    values, rows = {}, 0
    for name, (total, n) in sums.items():
        mean = (total / max(n, 1)).to(torch.float32)
        values[name] = mean
        rows = max(rows, n)
        for pname in aliases.get(id(linears[name].weight), []):
            values.setdefault(pname, mean)
    if not values:
        raise InputError("activation_importance: no nn.Linear ran on the samples")
    return Importance(values, samples=count, rows=rows)
