"""Export-friendly ``transformers`` implementations, switched on only while capturing.

``transformers`` picks an experts (MoE) and an attention *implementation* at run time from
its config (``config._experts_implementation``, ``config._attn_implementation``). The
defaults are written for GPUs, not for a fixed graph:

- experts ``"grouped_mm"`` (the default) sorts tokens by expert and multiplies over
  data-dependent group offsets (``sort``, ``histc``, ``cumsum``, the opaque
  ``transformers::grouped_mm_fallback``): nothing Circle can express, and onert 0.1.0 has
  no CUMSUM. ``"eager"`` loops over the experts a token picked (data-dependent shapes).
  ``"batched_mm"`` gathers each token's expert weights and uses batched matmuls: the
  same arithmetic in static shapes (GATHER + BATCH_MATMUL), which lowers.
- attention ``"flash_attention_*"`` / ``"flex_attention"`` / hub kernels are GPU kernels
  or higher-order ops; ``"sdpa"`` (or ``"eager"`` where a model has no SDPA path) lowers.

:func:`export_friendly` switches exactly those two config attributes (and, for a model
exported whole with no cache argument, ``use_cache``: its Cache output is not a tensor) for the duration of
``torch.export`` and puts the original values back afterwards, whatever happens (weights
are never touched: the implementations share the same parameters). Each switch is
returned as a note that ``CircleModel.summary()`` prints. ``export(...,
switch_implementations=False)`` turns this off; then the unsupported-op error names the
remedy (:func:`remedies`).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

#: implementations that capture into ops circle_fx lowers
EXPERTS_OK = "batched_mm"
ATTENTION_OK = ("sdpa", "eager")

_EXPERTS_ATTR = "_experts_implementation_internal"
_ATTN_ATTR = "_attn_implementation_internal"
_MISSING = object()


def _is_experts_module(m: torch.nn.Module) -> bool:
    """A module whose forward dispatches on ``config._experts_implementation``
    (transformers' ``@use_experts_implementation`` sets these attributes in ``__init__``)."""
    return (hasattr(m, "_is_expert_parallel") and hasattr(m, "is_concatenated")
            and hasattr(getattr(m, "config", None), _EXPERTS_ATTR))


def _plan(model: torch.nn.Module, kwargs: dict | None = None) -> list[tuple[object, str, object, str]]:
    """``(config, attribute, new value, note)`` for every switch to make."""
    plan: list[tuple[object, str, object, str]] = []
    config = getattr(model, "config", None)
    if (hasattr(type(model), "_supports_sdpa") and getattr(config, "use_cache", False) is True
            and not {"use_cache", "past_key_values"} & set(kwargs or {})):
        # a PreTrainedModel exported as it is: with use_cache (the default of every causal LM
        # config) its forward returns a transformers Cache object, which torch.export cannot
        # flatten; the whole-sequence export has no use for it (export_llm builds the cache models)
        plan.append((config, "use_cache", False, "transformers use_cache True -> False for the export "
                     f"({type(model).__name__}: the file computes the whole sequence and returns no KV cache; "
                     "circle_fx.export_llm builds cached prefill/decode models; the model is restored afterwards)"))
    experts: dict[int, list] = {}
    for m in model.modules():
        if _is_experts_module(m):
            experts.setdefault(id(m.config), [m.config, type(m).__name__, 0])[2] += 1
    for config, cls, count in experts.values():
        current = config.__dict__.get(_EXPERTS_ATTR)
        if current != EXPERTS_OK:
            plan.append((config, _EXPERTS_ATTR, EXPERTS_OK,
                         f"transformers experts implementation {current or 'grouped_mm'!r} -> {EXPERTS_OK!r} "
                         f"for the export ({count} {cls} module(s); the model is restored afterwards)"))
    attention: dict[int, list] = {}
    for m in model.modules():
        config = getattr(m, "config", None)
        if hasattr(config, _ATTN_ATTR) and hasattr(type(m), "_supports_sdpa"):  # a PreTrainedModel
            entry = attention.setdefault(id(config), [config, type(m).__name__, False])
            entry[2] = entry[2] or bool(type(m)._supports_sdpa)
    for config, cls, sdpa in attention.values():
        current = config.__dict__.get(_ATTN_ATTR)
        if current is not None and current not in ATTENTION_OK:
            new = "sdpa" if sdpa else "eager"
            plan.append((config, _ATTN_ATTR, new,
                         f"transformers attention implementation {current!r} -> {new!r} for the export "
                         f"({cls}; the model is restored afterwards)"))
    return plan


@contextmanager
def export_friendly(model: torch.nn.Module, enabled: bool = True, kwargs: dict | None = None) -> Iterator[list[str]]:
    """Within the block, ``model`` uses export-friendly implementations; yields the notes.

    The attributes are written into the config's ``__dict__`` directly (not through the
    config's recursive setters), so restoring them is exact: the old value goes back, or
    the attribute is deleted again if it did not exist.
    """
    notes: list[str] = []
    saved: list[tuple[object, str, object]] = []
    try:
        if enabled:
            for config, attr, value, note in _plan(model, kwargs):
                saved.append((config, attr, config.__dict__.get(attr, _MISSING)))
                config.__dict__[attr] = value
                notes.append(note)
        yield notes
    finally:
        for config, attr, old in reversed(saved):
            if old is _MISSING:
                config.__dict__.pop(attr, None)
            else:
                config.__dict__[attr] = old


#: op names (as in UnsupportedOpError) that only transformers' default MoE experts produce
_GROUPED_MM_OPS = ("transformers.grouped_mm_fallback", "aten.histc", "aten._grouped_mm")


def remedies(op_names: list[str]) -> list[str]:
    """Lines to add to an unsupported-op error when the ops come from a switchable implementation."""
    if any(name.startswith(_GROUPED_MM_OPS) for name in op_names):
        return ["  remedy: these ops come from transformers' default 'grouped_mm' experts (MoE) "
                "implementation. circle_fx.export switches a transformers model to 'batched_mm' while "
                "exporting unless switch_implementations=False is passed; or call "
                "model.set_experts_implementation('batched_mm') before exporting"]
    return []
