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


_TRAINED: dict = {}


def trained_llama():
    """A tiny Llama (vocab 128, hidden 64, 2 layers) trained for 100 Adam steps (~4 s on one thread)
    on the first 4000 characters of CPython's pydoc "execmodel" text, as bytes & 127. A random-weight
    model has near-uniform logits, where a quantization's damage cannot be told from noise; this one
    predicts its text (loss ~1.9 nats/char, mean top-1 probability ~0.4), like a real LM in
    miniature. Deterministic (seeded, one thread); trained once per process, a fresh copy each call."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=128)
    if "state" not in _TRAINED:
        from pydoc_data.topics import topics

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # also 3-15x faster than 2 threads for these tiny ops on a busy host
        try:
            torch.manual_seed(0)
            model = LlamaForCausalLM(cfg)
            data = torch.tensor([b & 127 for b in topics["execmodel"][:4000].encode("ascii", "replace")])
            opt = torch.optim.Adam(model.parameters(), lr=5e-3)
            g = torch.Generator().manual_seed(0)
            for _ in range(100):
                starts = torch.randint(0, len(data) - 33, (16,), generator=g)
                x = torch.stack([data[s:s + 32] for s in starts])
                loss = model(x, labels=x).loss
                opt.zero_grad()
                loss.backward()
                opt.step()
        finally:
            torch.set_num_threads(threads)
        _TRAINED["state"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        _TRAINED["loss"] = loss.item()
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(_TRAINED["state"])
    return model.eval()


def trained_llama_factory():
    """CLI factory (``tests/llm_models.py:trained_llama_factory``); trains once per process even when
    the CLI loads this file under another module name."""
    import sys

    shared = sys.modules.get("llm_models")
    return (shared.trained_llama if shared is not None else trained_llama)()
