"""Tiny, randomly initialised ``transformers`` models, one factory per model family.

Every factory builds the model exactly as a user would (``XForCausalLM(config)``, default
attention implementation, no patching) from a config small enough to export and run in
a few seconds: hidden 64, 2 layers, 4 heads / 2 KV heads, vocab 256. The configs switch
on what makes a family different (sliding windows shorter than the test sequence,
Gemma3's q/k norms on a sliding + a full layer, SmolLM3's NoPE layer, Granite's
multipliers, Phi3's fused qkv) so the Circle model has to get those right too.

Weights are random with a fixed seed; the norm scales are then perturbed away from
their initial ones/zeros so a wrongly applied (or dropped) RMSNorm weight changes the
output instead of hiding behind an identity scale.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import transformers

SEED = 0
SEQ_LEN = 8
VOCAB = 256

#: shared by every decoder family
DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
               pad_token_id=0, bos_token_id=1, eos_token_id=2)  # family defaults lie outside the tiny vocab


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[], torch.nn.Module]
    #: "logits" (causal LM, exported with use_cache=False) or "last_hidden_state" (encoder)
    output: str = "logits"
    #: why the family cannot be lowered yet (the test xfails strictly, on UnsupportedOpError only)
    xfail: str | None = None
    #: operators the test otherwise forbids that this family legitimately needs: op -> why
    allowed_ops: dict = field(default_factory=dict)

    @property
    def example_kwargs(self) -> dict:
        return {"use_cache": False} if self.output == "logits" else {}


def is_rms_norm_module(module: torch.nn.Module) -> bool:
    """RMSNorm classes by name; T5's ``T5LayerNorm`` is an RMSNorm (no centring, no bias)."""
    name = type(module).__name__
    return name.endswith("RMSNorm") or name == "T5LayerNorm"


def _perturb_norms(model: torch.nn.Module) -> torch.nn.Module:
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for m in model.modules():
            w = getattr(m, "weight", None)
            if is_rms_norm_module(m) and isinstance(w, torch.Tensor):
                w.add_(0.2 * torch.randn(w.shape, generator=gen))
    return model


def _causal_lm(config_cls: str, model_cls: str, **overrides) -> Callable[[], torch.nn.Module]:
    def build():
        torch.manual_seed(SEED)
        config = getattr(transformers, config_cls)(**{**DECODER, **overrides})
        return _perturb_norms(getattr(transformers, model_cls)(config).eval())
    return build


def _t5_encoder(**overrides) -> Callable[[], torch.nn.Module]:
    def build():
        torch.manual_seed(SEED)
        config = transformers.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                       num_heads=4, relative_attention_num_buckets=8,
                                       relative_attention_max_distance=16, **overrides)
        return _perturb_norms(transformers.T5EncoderModel(config).eval())
    return build


# max_position_embeddings matches the YaRN factor of the default rope config (else transformers warns)
GPT_OSS = dict(num_local_experts=4, num_experts_per_tok=2, head_dim=16, sliding_window=4,
               max_position_embeddings=131072)

FAMILIES = [
    Family("llama", _causal_lm("LlamaConfig", "LlamaForCausalLM")),
    Family("mistral", _causal_lm("MistralConfig", "MistralForCausalLM", sliding_window=4)),
    Family("qwen2", _causal_lm("Qwen2Config", "Qwen2ForCausalLM")),
    Family("qwen3", _causal_lm("Qwen3Config", "Qwen3ForCausalLM", head_dim=16)),
    Family("gemma", _causal_lm("GemmaConfig", "GemmaForCausalLM", head_dim=16)),
    Family("gemma2", _causal_lm("Gemma2Config", "Gemma2ForCausalLM", head_dim=16, sliding_window=4)),
    Family("gemma3_text", _causal_lm("Gemma3TextConfig", "Gemma3ForCausalLM", head_dim=16, sliding_window=4,
                                     layer_types=["sliding_attention", "full_attention"])),
    Family("phi3", _causal_lm("Phi3Config", "Phi3ForCausalLM")),
    Family("olmo2", _causal_lm("Olmo2Config", "Olmo2ForCausalLM")),
    Family("smollm3", _causal_lm("SmolLM3Config", "SmolLM3ForCausalLM", no_rope_layer_interval=2)),
    Family("granite", _causal_lm("GraniteConfig", "GraniteForCausalLM", embedding_multiplier=2.0,
                                 residual_multiplier=0.5, attention_multiplier=0.3, logits_scaling=4.0)),
    Family("t5_encoder", _t5_encoder(), output="last_hidden_state"),
    Family("t5_v1_1_encoder", _t5_encoder(feed_forward_proj="gated-gelu"), output="last_hidden_state",
           allowed_ops={"POW": "T5 v1.1's gelu_new computes x**3 (GELU tanh approximation), not a norm"}),
    # default settings: export switches transformers' 'grouped_mm' experts to 'batched_mm' while capturing
    Family("gpt_oss", _causal_lm("GptOssConfig", "GptOssForCausalLM", **GPT_OSS),
           allowed_ops={op: "topk of the MoE router masks each round's winner (EQUAL + SELECT_V2)"
                        for op in ("EQUAL", "SELECT_V2")}),
    # the same model with a public transformers option: experts gathered per token, no sorting
    Family("gpt_oss_batched_mm", _causal_lm("GptOssConfig", "GptOssForCausalLM", **GPT_OSS,
                                            experts_implementation="batched_mm"),
           allowed_ops={op: "topk of the MoE router masks each round's winner (EQUAL + SELECT_V2)"
                        for op in ("EQUAL", "SELECT_V2")}),
]

BY_NAME = {f.name: f for f in FAMILIES}
