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


def generates_like_transformers(model, directory, prompts=([5, 17, 9], [5, 17, 9, 33, 42, 100, 7]), new=6,
                                max_seq_len=16, prefill_len=4, atol=1e-4, buckets="auto"):
    """export_llm ``model``, then for each prompt generate ``new`` greedy tokens with
    ``LLMRunner.generate`` in onert, through the prefill model and through decode steps only,
    and assert transformers' ``model.generate`` picks the same tokens from the same logits
    (within ``atol``; ``scripts/greedy_reference.py``). Returns the package's manifest."""
    import circle_fx

    model.config.use_cache = True
    model.generation_config.use_cache = True
    pkg = circle_fx.export_llm(model, max_seq_len=max_seq_len, prefill_len=prefill_len, tokenizer=None, buckets=buckets)
    pkg.save(directory)
    greedy_reference().assert_generates_like_transformers(pkg.runner(), model, prompts, new, logit_tol=atol)
    return pkg.manifest


def greedy_reference():
    """``scripts/greedy_reference.py``: the one comparison of onert's greedy generation with
    transformers', shared with ``scripts/generation_support.py``."""
    import importlib
    import os
    import sys

    scripts = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    return importlib.import_module("greedy_reference")
