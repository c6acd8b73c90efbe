"""Tiny random-weight causal LMs for the export_llm tests (nothing is downloaded)."""
from __future__ import annotations

import torch


def tiny(family: str):
    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                  num_key_value_heads=2)
    if family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, **common)).eval()
    if family == "qwen3":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        return Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=2, head_dim=8, **common)).eval()
    if family == "gemma3":
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        # sliding window 6, shorter than the prompts + generation: the masks must really slide
        cfg = Gemma3TextConfig(num_hidden_layers=3, head_dim=8, sliding_window=6, sliding_window_pattern=2, **common)
        assert "sliding_attention" in cfg.layer_types and "full_attention" in cfg.layer_types
        return Gemma3ForCausalLM(cfg).eval()
    if family == "lfm2":
        from transformers import Lfm2Config, Lfm2ForCausalLM

        # a short-conv layer (conv window state) and an attention layer (K/V)
        cfg = Lfm2Config(num_hidden_layers=2, layer_types=["conv", "full_attention"], **common)
        return Lfm2ForCausalLM(cfg).eval()
    raise ValueError(family)


def tiny_llama_factory():
    """CLI factory (``tests/llm_models.py:tiny_llama_factory``)."""
    return tiny("llama")
