"""Every decoder-only causal-LM family of the installed ``transformers``, as tiny random models.

The list is not hand-picked: it is ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` (model type ->
``XForCausalLM`` class). Each family's config is built generically: the family's own
defaults, with the usual size attributes (those the default config has, directly or via its
``attribute_map``) overridden to tiny values, so a model builds and runs in a second.
Families with several layer kinds (``layer_types``: sliding/full attention, conv/attention,
linear attention...) keep one layer of each kind, so every kind is exercised; per-layer lists
with literal defaults (Reformer's ``attn_layers``) are cut to the kept layers, and lists the
config derives in ``__post_init__`` are left to that derivation.
Layer kinds a config derives itself (a read-only ``layer_types`` from a period, pattern or
index list: Mamba, Jamba, RecurrentGemma) keep the shortest prefix of the default layers that
has every kind.

A composite config (text + vision / audio parts) whose causal-LM class takes its text part
builds that part, as ``AutoModelForCausalLM.from_config`` does (``llama4`` ->
``Llama4TextConfig``); a class that takes the composite gets every sub-config shrunk
(Fuyu's ``text_config``, DBRX's ``attn_config`` / ``ffn_config``). When a family's validator
rejects a tiny value it names, that value reverts to the family's default; the few families
whose defaults cannot run at all get a documented entry in :data:`OVERRIDES`.

A family is *skipped* (with the reason) when its class is not a plain text decoder:
encoder-decoder / multimodal wrappers (``...ForConditionalGeneration``; the reason names
the row of their text decoder), speculative-decoding drafters, models that need inputs
other than ``input_ids``, or classes missing from this transformers build.

Used by ``scripts/model_support.py`` (the table in docs/model-support.md) and by the slow
test ``tests/e2e/test_hf_families.py``.
"""
from __future__ import annotations

import inspect
import os
import sys
import warnings
from dataclasses import dataclass

import torch

SEED = 0
SEQ_LEN = 8
VOCAB = 256

#: tiny sizes, applied to every attribute of this name the family's default config has
TINY = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=VOCAB, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    # mixture of experts
    moe_intermediate_size=32, num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2,
    n_shared_experts=1, shared_expert_intermediate_size=64, n_group=2, topk_group=1, first_k_dense_replace=1,
    # MLA (DeepSeek-style latent attention)
    kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    # local attention shorter than the test sequence, so the window matters
    sliding_window=4, attention_chunk_size=4,
    # GPT-2-style spellings of the same sizes (most configs map them via attribute_map)
    n_embd=64, n_layer=2, n_head=4, n_inner=128, n_positions=128, d_model=64, ffn_dim=128,
    ffn_hidden_size=128,
    # CPM-Ant's names for the head and feed-forward sizes
    dim_head=16, dim_ff=128,
    # the decoder (and encoder) sizes of BART-style configs, which map only the encoder's
    decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=128,
    encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
    # partial rotary (GPT-J / CodeGen rotate the first `rotary_dim` dims of each head)
    rotary_dim=8,
    # recurrent / state-space blocks
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    mamba_d_state=8, mamba_n_heads=4, state_size=8, time_step_rank=8, mamba_dt_rank=8,
    # Mamba-2 heads: n_heads * d_head must equal the inner size (expand 2 x hidden, or d_ssm)
    mamba_d_head=32, mamba_d_ssm=128, lru_width=64,
    # chunked (Mamba-2 SSD) scans: two chunks of the test sequence, so the inter-chunk state runs
    mamba_chunk_size=4,
    # misc. size knobs that otherwise make "tiny" models large
    intermediate_size_mlp=128, block_multiple_of=16, hc_lowrank=16, hidden_size_global=64,
    vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=16,
    # Python loops over huge default lists / dims
    layer_scan_block=1,
)


#: weight-init scales: a family whose *default* init std is above :data:`INIT_STD_MAX` gets
#: :data:`INIT_STD` (transformers' usual ``initializer_range``). Such a default only makes
#: sense with a forward that divides by ``sqrt(fan_in)`` (CPM-Live's own ``Linear`` did;
#: transformers' CPM-Ant port uses plain ``nn.Linear`` with ``init_std=1.0``), so random
#: weights at that scale multiply activations by ~sqrt(fan_in) per projection: CPM-Ant's tiny
#: model had attention scores of ~250 and logits that move by 2.8e-4 when every weight is
#: perturbed by one float32 ulp in float64 arithmetic -- float32 rounding, not a lowering,
#: then decides the comparison. Families at or below the cap (0.1: MiniCPM3, Mamba) keep theirs.
INIT_STD_FIELDS = ("init_std", "initializer_range")
INIT_STD_MAX = 0.1
INIT_STD = 0.02


#: the few config classes (by ``model_type``, else class name) that need more than the generic shrinking:
#: a default config that hides a layer kind the tiny model must exercise, or values the
#: family's checkpoints always set but its defaults leave unusable (applied after the generic
#: sizes, never reverted; each says why)
OVERRIDES = {
    "lfm2": dict(layer_types=["conv", "full_attention"]),  # default: all attention, no short conv
    "lfm2_moe": dict(layer_types=["conv", "full_attention"]),
    # `attention_layers` is expanded from this (pattern, repeats) list: one global + one local layer
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]]),
    # the attention always builds the QSA indexer, but its sizes default to None
    "qwen4_exp_text": dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=4,
                           indexer_compress_ratio=2),
    # rotary parameters are looked up per layer type (default: none); multimodal RoPE sections
    # must add up to half the (tiny) head dim
    "cohere_compass_text": dict(rope_parameters={"full_attention": {
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]}}),
    # the attention reads attn_config.rope_theta (absent from the class, set by DBRX checkpoints)
    # and clamps q/k/v with clip_qkv (default None: torch.clamp refuses; checkpoints use 8)
    "DbrxAttentionConfig": dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0),
    # the last `num_kv_shared_layers` layers reuse the cache of the last earlier layer of their
    # kind: two layers of each kind, the second pair shared. The first layers of the checkpoints
    # use top-k activation sparsity (0.95; derived only for > 10 layers): the first pair too
    "gemma3n_text": dict(layer_types=["sliding_attention", "full_attention"] * 2, num_kv_shared_layers=2,
                         activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0]),
    # the LM head asserts a decoder; axial position embeddings must add up to the hidden size
    # and cover the sequence
    "reformer": dict(is_decoder=True, axial_pos_embds_dim=(32, 32), axial_pos_shape=(4, 2),
                     attention_head_size=16),
    # the adapters are chosen per language; without a default the forward refuses to run
    "xmod": dict(default_language="en_XX"),
    "bamba": dict(attn_layer_indices=[1]),  # default: all Mamba-2 layers, no attention
    "granitemoehybrid": dict(layer_types=["linear_attention", "full_attention"]),  # default: all Mamba-2 layers
    "mamba2": dict(num_heads=8, chunk_size=4),  # heads: expand 2 x hidden 64 / head_dim 16
    # chunked scans (default chunk >= the test sequence): two chunks, so the state between them runs
    "zamba2": dict(chunk_size=4), "nemotron_h": dict(chunk_size=4), "xlstm": dict(chunk_size=4),
    # the hybrid layers share one transformer block (tied weights): two of them, so the tie exists
    "zamba": dict(layer_types=["linear_attention", "hybrid", "hybrid"]),
}


#: causal-LM classes whose forward is not a text decoder over ``input_ids`` (why, as measured
#: on transformers' source); listed, not run
NOT_A_TEXT_DECODER = {
    "Gemma4AssistantForCausalLM": "speculative-decoding drafter: forward ignores input_ids and requires "
                                  "inputs_embeds + shared_kv_states (the target Gemma 4 model's hidden states "
                                  "and per-layer-type KV cache)",
    "Gemma4UnifiedAssistantForCausalLM": "speculative-decoding drafter: forward ignores input_ids and requires "
                                         "inputs_embeds + shared_kv_states (the target Gemma 4 model's hidden "
                                         "states and per-layer-type KV cache)",
}


@dataclass(frozen=True)
class HfFamily:
    model_type: str
    model_class: str
    #: why the family is not run (None: it is a text decoder we build and try)
    skip: str | None = None


def enumerate_families() -> list[HfFamily]:
    """One entry per model type in transformers' causal-LM auto mapping (sorted)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    out = []
    for model_type, cls_name in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        skip = None
        if not hasattr(transformers, cls_name):
            skip = f"{cls_name} is not importable from this transformers build"
        elif "ConditionalGeneration" in cls_name:
            skip = f"{cls_name} is a multimodal / encoder-decoder wrapper (needs non-text inputs)"
            text = _text_family(model_type, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
            if text:
                skip += f"; its text decoder is the `{text}` row"
        elif cls_name in NOT_A_TEXT_DECODER:
            skip = f"{cls_name} is a {NOT_A_TEXT_DECODER[cls_name]}"
        out.append(HfFamily(model_type, cls_name, skip))
    return out


def _text_family(model_type: str, mapping) -> str | None:
    """The causal-LM family of a multimodal config's text part (``gemma3`` -> ``gemma3_text``),
    when the mapping has it as a row of its own."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    text_type = getattr(cls.sub_configs.get("text_config"), "model_type", "") if hasattr(cls, "sub_configs") else ""
    if not text_type:  # an AutoConfig slot: the default config says which family fills it
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                text_type = getattr(getattr(cls(), "text_config", None), "model_type", "")
        except Exception:
            return None
    return text_type if text_type in mapping and text_type != model_type else None


def _layer_types(default) -> list | None:
    """One layer of each kind the family's default config uses (at least two layers)."""
    types = getattr(default, "layer_types", None)
    if not isinstance(types, (list, tuple)) or not types:
        return None
    distinct = list(dict.fromkeys(types))
    while len(distinct) < 2:
        distinct.append(distinct[-1])
    return distinct


def tiny_config(model_type: str, model_class: str | None = None):
    """The family's default config with the :data:`TINY` sizes it knows about.

    With ``model_class``, the config is the one that class is built from (see
    :func:`config_class_for`): Llama4's ``Llama4ForCausalLM`` takes the text part of
    ``Llama4Config``, as ``AutoModelForCausalLM.from_config`` does."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = config_class_for(CONFIG_MAPPING[model_type], model_class)
    config = _tiny(cls)
    config.use_cache = False
    return config


def config_class_for(cls, model_class: str | None):
    """The config class ``model_class`` is built from. A composite config (text + vision /
    audio / codec parts) whose causal-LM class takes one of its parts gives that part's class:
    transformers' auto classes do this for ``text_config``; MusicGen's decoder is the same case
    under another key. Otherwise the family's own config class."""
    import transformers

    wanted = getattr(getattr(transformers, model_class, None), "config_class", None) if model_class else None
    if wanted is None or wanted is cls:
        return cls
    for sub in getattr(cls, "sub_configs", {}).values():
        if sub is wanted:
            return sub
    return cls


def _tiny(cls):
    """``cls``'s defaults, shrunk: :data:`TINY` sizes, a sane init scale (:data:`INIT_STD_MAX`),
    one layer per layer kind, literal
    per-layer lists cut to the kept layers, sub-configs (a composite's ``text_config``, DBRX's
    ``attn_config``/``ffn_config``) shrunk the same way, then the family's :data:`OVERRIDES`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = cls()
        kwargs = {k: v for k, v in TINY.items() if _has_attr(default, k)}
        kwargs.update({k: INIT_STD for k in INIT_STD_FIELDS
                       if isinstance(getattr(default, k, None), float) and getattr(default, k) > INIT_STD_MAX})
        if "qk_rope_head_dim" in kwargs and "head_dim" in kwargs:
            kwargs["head_dim"] = kwargs["qk_rope_head_dim"]  # MLA: rotary dims are the "head_dim"
        if "kv_lora_rank" in kwargs and "num_key_value_heads" in kwargs:
            kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]  # MLA expands k/v per head
        # the real field (an attribute_map alias set at init comes after __post_init__ derived
        # things from it: Zamba2's hybrid_layer_ids)
        types_field = getattr(cls, "attribute_map", {}).get("layer_types", "layer_types")
        types = _layer_types(default)
        if types is not None and _settable(cls, "layer_types"):
            kwargs[types_field] = types
            kwargs["num_hidden_layers"] = len(types)
        elif types is not None:  # derived from a period / pattern / index list: keep the family's
            kwargs["num_hidden_layers"] = _covering_prefix(default.layer_types)  # own, cut short
        overrides = OVERRIDES.get(cls.model_type or cls.__name__, {})  # sub-configs may lack a model_type
        for k, v in overrides.items():
            if k == "layer_types":
                k = types_field
                kwargs["num_hidden_layers"] = len(v)
            kwargs[k] = v
        kwargs.update({k: v for k, v in _per_layer_lists(default, kwargs).items() if k not in overrides})
        kwargs.update({k: v for k, v in _tiny_sub_configs(default).items() if k not in overrides})
        return _construct(cls, kwargs, keep=set(overrides))


def _settable(cls, name: str) -> bool:
    """Whether ``name`` (or what ``attribute_map`` maps it to) is a plain config field, not a
    read-only property derived from others (Mamba's ``layer_types``, Bamba's ``layers_block_type``)."""
    name = getattr(cls, "attribute_map", {}).get(name, name)
    prop = inspect.getattr_static(cls, name, None)
    return not isinstance(prop, property) or prop.fset is not None


def _covering_prefix(types) -> int:
    """The fewest leading layers (at least two) that contain every layer kind of ``types``."""
    kinds = set(types)
    for n in range(2, len(types) + 1):
        if set(types[:n]) == kinds:
            return n
    return len(types)


def _has_attr(config, name: str) -> bool:
    return name in getattr(config, "attribute_map", {}) or name in vars(config)


def _per_layer_lists(default, kwargs: dict) -> dict:
    """List / tuple fields of ``default`` with one entry per layer (as long as its layer count)
    whose class default is a literal list (Reformer's ``attn_layers``), cut to the tiny layers:
    the entries of the layers kept by ``layer_types`` (the first layer of each kind), else of
    the first layers. Lists the config derives from other fields (``None`` default, filled in
    ``__post_init__``: ``mlp_layer_types`` from ``first_k_dense_replace``...) are left to that
    derivation, so they follow the tiny sizes."""
    import dataclasses

    n_default = getattr(default, "num_hidden_layers", None)
    n = kwargs.get("num_hidden_layers")
    if not isinstance(n_default, int) or not isinstance(n, int) or n_default <= max(n, 2):
        return {}
    fields = getattr(type(default), "__dataclass_fields__", {})
    literal = {name for name, f in fields.items()
               if isinstance(f.default, (list, tuple)) or f.default_factory is not dataclasses.MISSING}
    keep = _kept_layers(getattr(default, "layer_types", None), kwargs.get("layer_types"), n)
    return {name: type(value)(value[i] for i in keep) for name, value in vars(default).items()
            if name in literal and name not in kwargs and name != "layer_types"
            and isinstance(value, (list, tuple)) and len(value) == n_default}


def _kept_layers(default_types, tiny_types, n: int) -> list[int]:
    """Indices (into the default layers) of the ``n`` tiny layers: each tiny layer kind matched,
    in order, to the next default layer of that kind; the first ``n`` layers otherwise."""
    if not isinstance(default_types, (list, tuple)) or not isinstance(tiny_types, (list, tuple)):
        return list(range(n))
    keep, start = [], 0
    for kind in tiny_types:
        i = next((j for j in range(start, len(default_types)) if default_types[j] == kind), None)
        if i is None:
            return list(range(n))
        keep.append(i)
        start = i + 1
    return keep


def _tiny_sub_configs(default) -> dict:
    """The nested configs of ``default`` (``sub_configs``: a composite's ``text_config``, DBRX's
    ``attn_config``...), each shrunk by :func:`_tiny`."""
    from transformers import PreTrainedConfig

    out = {}
    for key in getattr(default, "sub_configs", {}):
        sub = getattr(default, key, None)
        if isinstance(sub, PreTrainedConfig):
            try:
                out[key] = _tiny(type(sub))
            except Exception:  # noqa: BLE001 - a part that does not shrink keeps its defaults
                pass
    return out


def _construct(cls, kwargs: dict, keep: set):
    """``cls(**kwargs)``; when the family's validator rejects tiny values it names (ZAYA:
    "supports `num_experts_per_tok=1` only"), those revert to the family's defaults. Values in
    ``keep`` (the family's overrides) never revert."""
    import re

    from huggingface_hub.errors import StrictDataclassError

    while True:
        try:
            return cls(**kwargs)
        except (ValueError, StrictDataclassError) as e:
            named = [k for k in kwargs if k in TINY and k not in keep and re.search(rf"\b{k}\b", str(e))]
            if not named:
                raise
            for k in named:
                kwargs.pop(k)


class SkipFamily(Exception):
    """The family cannot be built as a plain tiny text decoder (the message says why)."""


def is_rms_norm_module(module: torch.nn.Module) -> bool:
    """RMSNorm classes by name (``...RMSNorm``, ``...RMSNormGated``...), T5's ``T5LayerNorm``."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from families import is_rms_norm_module as by_name  # the rule the family tests use

    return by_name(module) or "RMSNorm" in type(module).__name__


def build(model_type: str, model_class: str, decoder: bool = False) -> torch.nn.Module:
    """The tiny random model, norm scales perturbed away from ones/zeros (a dropped or
    wrongly applied norm weight must change the output), and constant weight matrices made
    random (:func:`break_ties`).

    ``decoder``: set ``config.is_decoder`` where the config has it (BERT-style ``…ForCausalLM``
    classes: their default ``False`` builds a bidirectional-mask model whose layers skip the
    cache, which transformers itself warns is not a standalone decoder); the generation table
    builds every family this way, the export table as the config comes."""
    import transformers

    config = tiny_config(model_type, model_class)
    if decoder and hasattr(config, "is_decoder"):
        config.is_decoder = True
    cls = getattr(transformers, model_class)
    params = inspect.signature(cls.forward).parameters
    if "input_ids" not in params:
        raise SkipFamily(f"{model_class}.forward takes no input_ids")
    torch.manual_seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls(config).eval()
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for m in model.modules():
            w = getattr(m, "weight", None)
            if is_rms_norm_module(m) and isinstance(w, torch.Tensor) and w.ndim == 1:
                w.add_(0.2 * torch.randn(w.shape, generator=gen))
    break_ties(model, gen)
    return model


def break_ties(model: torch.nn.Module, gen: torch.Generator) -> list[str]:
    """Give every constant floating weight matrix (all elements equal) random values; return
    their names. transformers zero-initialises some router gates (Afmoe's), so every expert
    scores the same and the experts top-k picks depend on how the runtime breaks ties
    (torch's CPU topk and onert's differ; docs/onert-findings.md), not on the model."""
    names = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.is_floating_point() and p.ndim >= 2 and p.numel() > 1 and bool((p == p.flatten()[0]).all()):
                p.add_(0.02 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
                names.append(name)
    return names


def example_inputs(model=None) -> tuple[torch.Tensor]:
    """``input_ids`` of one sequence; models over several parallel token streams (MusicGen's
    codebooks: ``input_ids`` of shape ``(batch * num_codebooks, seq)``) get one row per stream."""
    rows = getattr(getattr(model, "config", None), "num_codebooks", None) or 1
    return (torch.randint(3, VOCAB, (rows, SEQ_LEN), generator=torch.Generator().manual_seed(SEED)),)


def example_kwargs(model) -> dict:
    params = inspect.signature(model.forward).parameters
    return {"use_cache": False} if "use_cache" in params else {}


def computes_rms_norm(module: torch.nn.Module, args, out) -> bool:
    """Whether this call's output is ``x * rsqrt(mean(x**2, -1) + eps) [* w | * (1 + w)]``:
    catches RMSNorms under other names (Llama4's ``L2Norm``, weightless q/k norms)."""
    if not args or not isinstance(args[0], torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    if isinstance(module, torch.nn.LayerNorm) or isinstance(getattr(module, "bias", None), torch.Tensor):
        return False  # a LayerNorm matches on zero-mean input (the output of another norm)
    x = args[0].float()
    if out.shape != x.shape or not x.is_floating_point() or x.numel() == 0:
        return False
    eps = next((float(getattr(module, a)) for a in ("eps", "variance_epsilon", "epsilon", "norm_eps")
                if isinstance(getattr(module, a, None), (int, float))), 1e-6)
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    w = getattr(module, "weight", None)
    scales = [None] if not isinstance(w, torch.Tensor) else [w.float(), 1 + w.float()]
    return any(torch.allclose(out.float(), normed if s is None else normed * s, rtol=1e-4, atol=1e-5)
               for s in scales)


def eager_with_norm_calls(model, ids) -> tuple[torch.Tensor, int]:
    """Eager logits and how many times RMSNorm modules ran (forward hooks): modules named
    RMSNorm, and leaf modules named ``...Norm`` whose output is an RMSNorm of their input.
    A norm module whose forward runs another counted norm module is a wrapper (AXK2's
    ``GatedRMSNorm``: ``y = RMSNorm(x); y * sigmoid(mlp(y))``): only the inner norm counts."""
    calls = [0]
    inner: list[int] = []  # per norm call in progress: counted norm calls made inside it

    def pre(mod, args):
        inner.append(0)

    def hook(mod, args, out):
        nested = inner.pop()
        counted = nested == 0 and (is_rms_norm_module(mod) or computes_rms_norm(mod, args, out))
        calls[0] += counted
        if inner:
            inner[-1] += nested + counted

    mods = [m for m in model.modules()
            if is_rms_norm_module(m) or ("Norm" in type(m).__name__ and not list(m.children()))]
    handles = [m.register_forward_pre_hook(pre) for m in mods] + [m.register_forward_hook(hook) for m in mods]
    try:
        with torch.no_grad():
            out = model(*ids, **example_kwargs(model))
    finally:
        for h in handles:
            h.remove()
    logits = out.logits if hasattr(out, "logits") else out[0]
    return logits, calls[0]
