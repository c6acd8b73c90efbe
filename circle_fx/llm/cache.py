"""The graph-side KV cache and the two traced entry points (prefill, decode step).

Why a ``transformers.Cache`` subclass and not a re-implemented decoder: the user's model
runs unpatched, through its own ``forward``. Its attention layers call
``cache.update(key_states, value_states, layer_idx)`` (the public Cache API) with the
keys *after* RoPE and any k-norm, exactly what must be cached. :class:`GraphCache`
answers that call functionally, without mutating anything (onert has no
DYNAMIC_UPDATE_SLICE and no variables):

- decode: ``update`` returns ``cat([cache_in, new_row], dim=2)`` — the caller's whole
  cache (a model input, never copied back out) plus the new row; the mask hides the
  cache slots at positions ``>= position``. The new row is recorded and becomes a model
  output, which the host writes into its cache in place (so caches stay bound to onert
  once, see ``runner.py``).
- prefill: ``update`` returns the keys/values of the prompt itself and records them.

The attention mask is built here and passed as a prepared 4-D mask (or a dict of them
per layer type for models with sliding-window layers), which ``transformers`` uses
as-is: HF's own mask construction needs ``arange``/run-time sizes that onert lacks.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class GraphCache(Cache):
    """Functional KV cache for tracing: ``keys``/``values`` are per-layer cache inputs
    ([1, kv_heads, max_seq_len, head_dim]) or None (prefill, no past)."""

    def __init__(self, num_layers: int, keys=None, values=None):
        super().__init__(layers=[DynamicLayer() for _ in range(num_layers)])
        self.past_keys, self.past_values = keys, values
        self.new_keys: list = [None] * num_layers
        self.new_values: list = [None] * num_layers

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.new_keys[layer_idx], self.new_values[layer_idx] = key_states, value_states
        if self.past_keys is None:
            return key_states, value_states
        k = torch.cat([self.past_keys[layer_idx], key_states], dim=2)
        v = torch.cat([self.past_values[layer_idx], value_states], dim=2)
        return k, v

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # never asked for once a prepared mask and position_ids are given

    def get_mask_sizes(self, query_length, layer_idx=0):
        raise AssertionError("circle_fx passes prepared masks; transformers should not build one")


def layer_kinds(config) -> list[str] | None:
    """``config.layer_types`` if the model builds one mask per layer type (a dict)."""
    kinds = getattr(config, "layer_types", None)
    return list(kinds) if kinds else None


def _as_mask(visible: torch.Tensor, float_mask: bool, dtype) -> torch.Tensor:
    """bool mask for SDPA; an additive float mask for the eager attention implementation."""
    if not float_mask:
        return visible
    zero = torch.zeros((), dtype=dtype)
    return torch.where(visible, zero, torch.full((), torch.finfo(dtype).min, dtype=dtype))


def _masks(config, visible_full, visible_sliding, float_mask, dtype):
    kinds = layer_kinds(config)
    if kinds is None:  # one mask for every layer (sliding when the config has a window, e.g. Mistral)
        return _as_mask(visible_sliding, float_mask, dtype)
    full = _as_mask(visible_full, float_mask, dtype)
    out = {"full_attention": full}
    if "sliding_attention" in kinds:  # export_llm has rejected any other layer type
        out["sliding_attention"] = _as_mask(visible_sliding, float_mask, dtype)
    return out


def _call(model, cache_kw, **kwargs):
    return model(**{cache_kw: kwargs.pop("cache")}, use_cache=True, **kwargs)


class DecodeStep(torch.nn.Module):
    """One token: ``(input_ids [1,1], position [1], key_cache_0, value_cache_0, ...)`` ->
    ``{"logits": [1,1,V], "key_0": [1,Hkv,1,D], "value_0": ..., ...}``."""

    def __init__(self, model, spec):
        super().__init__()
        self.model, self.spec = model, spec
        S = spec.max_seq_len
        # key slot j of the attention: cache rows 0..S-1, then the new row (index S).
        # lo[j] < position hides unwritten / future cache rows, and the new row (-1) always passes;
        # hi[j] > position - window is the sliding-window bound (the new row, S+window, always passes).
        self.register_buffer("lo", torch.cat([torch.arange(S), torch.tensor([-1])]).to(torch.int32), persistent=False)
        self.register_buffer("hi", torch.cat([torch.arange(S), torch.tensor([2 * S + 1])]).to(torch.int32),
                             persistent=False)

    def forward(self, input_ids, position, caches):
        spec, L = self.spec, self.spec.num_layers
        cache = GraphCache(L, caches[0::2], caches[1::2])
        full = self.lo < position
        sliding = full & (self.hi > position - spec.sliding_window) if spec.sliding_window else full
        shape = (1, 1, 1, spec.max_seq_len + 1)
        mask = _masks(self.model.config, full.view(shape), sliding.view(shape), spec.float_mask, spec.torch_dtype)
        out = _call(self.model, spec.cache_kw, input_ids=input_ids, position_ids=position.view(1, 1),
                    attention_mask=mask, cache=cache)
        result = {"logits": out.logits}
        for i in range(L):
            result[f"key_{i}"] = cache.new_keys[i]
            result[f"value_{i}"] = cache.new_values[i]
        return result


class Prefill(torch.nn.Module):
    """A prompt padded to ``prefill_len`` starting at position 0:
    ``(input_ids [1,P], last_index [1])`` -> ``{"logits": [1,1,V] at last_index,
    "key_0": [1,Hkv,P,D], ...}``. Right padding never changes the real tokens' results
    (causal mask), so no length input is needed beyond ``last_index``."""

    def __init__(self, model, spec):
        super().__init__()
        self.model, self.spec = model, spec
        P = spec.prefill_len
        self.register_buffer("positions", torch.arange(P, dtype=torch.int32).view(1, P), persistent=False)
        q = torch.arange(P).view(P, 1)
        k = torch.arange(P).view(1, P)
        causal = k <= q
        sliding = causal & (k > q - spec.sliding_window) if spec.sliding_window else causal
        self.register_buffer("causal", causal.view(1, 1, P, P), persistent=False)
        self.register_buffer("sliding", sliding.view(1, 1, P, P), persistent=False)

    def forward(self, input_ids, last_index):
        spec, L = self.spec, self.spec.num_layers
        cache = GraphCache(L)
        mask = _masks(self.model.config, self.causal, self.sliding, spec.float_mask, spec.torch_dtype)
        out = _call(self.model, spec.cache_kw, input_ids=input_ids, position_ids=self.positions,
                    attention_mask=mask, cache=cache, logits_to_keep=last_index)
        result = {"logits": out.logits}
        for i in range(L):
            result[f"key_{i}"] = cache.new_keys[i]
            result[f"value_{i}"] = cache.new_values[i]
        return result
