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

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer


class GraphCache(Cache):
    """Functional KV cache for tracing: ``past`` maps a layer index to its cache inputs
    ``(keys, values)`` ([1, heads, max_seq_len, dim], each layer its own shape) or is None
    (prefill, no past). ``new`` records what each layer handed to ``update``: the layers
    that cache (a layer that reuses another's K/V, Gemma 3n / 4, never calls it)."""

    def __init__(self, num_layers: int, past: dict | None = None):
        super().__init__(layers=[DynamicLayer() for _ in range(num_layers)])
        self.past = past
        self.new: dict[int, tuple] = {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.new[layer_idx] = (key_states, value_states)
        if self.past is None:
            return key_states, value_states
        past_k, past_v = self.past[layer_idx]
        return torch.cat([past_k, key_states], dim=2), torch.cat([past_v, value_states], dim=2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # never asked for once a prepared mask and position_ids are given

    def get_mask_sizes(self, query_length, layer_idx=0):
        raise AssertionError("circle_fx passes prepared masks; transformers should not build one")


@dataclass(frozen=True)
class LayerCache:
    """The K/V cache of one layer, as the model hands it to ``Cache.update``: heads and dims
    are read from the model's own tensors, per layer and separately for K and V (per-layer
    head_dim, Gemma 4; MLA's compressed latents, DeepSeek-V3: K = the kv_lora_rank latent, V =
    the rotary key part), never from the config."""

    layer: int
    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int

    def shapes(self, rows: int) -> tuple[list[int], list[int]]:
        return [1, self.key_heads, rows, self.key_dim], [1, self.value_heads, rows, self.value_dim]


def probe_caches(model, spec) -> list[LayerCache]:
    """Run the prefill wrapper once in eager (a prompt of zeros) and read what each layer
    caches; the shapes of the traced models' cache inputs and outputs follow from it."""
    with torch.no_grad():
        _, cache = Prefill(model, spec).run_cache(torch.zeros(1, spec.prefill_len, dtype=torch.int32),
                                               torch.zeros(1, dtype=torch.int32))
    out = []
    for i in sorted(cache.new):
        k, v = cache.new[i]
        out.append(LayerCache(i, int(k.shape[1]), int(k.shape[3]), int(v.shape[1]), int(v.shape[3])))
    return out


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
        cache = GraphCache(L, {c.layer: (caches[2 * j], caches[2 * j + 1]) for j, c in enumerate(spec.caches)})
        full = self.lo < position
        sliding = full & (self.hi > position - spec.sliding_window) if spec.sliding_window else full
        shape = (1, 1, 1, spec.max_seq_len + 1)
        mask = _masks(self.model.config, full.view(shape), sliding.view(shape), spec.float_mask, spec.torch_dtype)
        out = _call(self.model, spec.cache_kw, input_ids=input_ids, position_ids=position.view(1, 1),
                    attention_mask=mask, cache=cache)
        return _outputs(out, cache, spec)


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

    def run_cache(self, input_ids, last_index):
        cache = GraphCache(self.spec.num_layers)
        mask = _masks(self.model.config, self.causal, self.sliding, self.spec.float_mask, self.spec.torch_dtype)
        out = _call(self.model, self.spec.cache_kw, input_ids=input_ids, position_ids=self.positions,
                    attention_mask=mask, cache=cache, logits_to_keep=last_index)
        return out, cache

    def forward(self, input_ids, last_index):
        out, cache = self.run_cache(input_ids, last_index)
        return _outputs(out, cache, self.spec)


def _outputs(out, cache: GraphCache, spec) -> dict:
    """``logits`` and the new rows of every caching layer (``key_i``/``value_i``, i = the layer)."""
    result = {"logits": out.logits}
    for c in spec.caches:
        result[f"key_{c.layer}"], result[f"value_{c.layer}"] = cache.new[c.layer]
    return result
