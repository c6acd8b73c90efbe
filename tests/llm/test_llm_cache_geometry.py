"""export_llm reads each layer's K/V geometry from the tensors the model hands to
``Cache.update``, never from the config: per-layer head_dim (Gemma 4, whose global
``config.head_dim`` raises), MLA's compressed latents with K and V of different dims
(DeepSeek-V3), layers that reuse another layer's K/V and cache nothing (Gemma 4's shared
layers). Each generates transformers' exact greedy tokens in onert, and any exception the
model's own code raises comes out as a circle_fx ``ModelError`` naming the family."""
from __future__ import annotations

import os
import sys

import pytest

import circle_fx
from llm_models import tiny

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import hf_families as hf  # noqa: E402
from greedy_reference import assert_generates_like_transformers  # noqa: E402

PROMPTS = ([5, 17, 9, 33, 42, 100, 7],)  # longer than P: prefill, then decode steps
NEW, S, P = 8, 16, 4


def _generate_like_transformers(family: str, cls: str, tmp_path):
    model = hf.build(family, cls)
    model.config.use_cache = True
    pkg = circle_fx.export_llm(model, max_seq_len=S, prefill_len=P, tokenizer=None)
    pkg.save(tmp_path)
    assert_generates_like_transformers(pkg.runner(), model, PROMPTS, NEW, logit_tol=None, label=family)
    return model, pkg.manifest


@pytest.mark.slow
def test_mla_caches_latents_of_different_k_and_v_dims(tmp_path):
    model, m = _generate_like_transformers("deepseek_v3", "DeepseekV3ForCausalLM", tmp_path)
    cfg = model.config
    # MLA caches one shared head: K = the kv_lora_rank latent, V = the rotary key
    assert m["cache"]["shapes"]["key_cache_0"] == [1, 1, S, cfg.kv_lora_rank]
    assert m["cache"]["shapes"]["value_cache_0"] == [1, 1, S, cfg.qk_rope_head_dim]
    assert cfg.kv_lora_rank != cfg.qk_rope_head_dim and m["cache"]["shape"] is None


@pytest.mark.slow
def test_per_layer_head_dim_and_shared_kv_layers(tmp_path):
    model, m = _generate_like_transformers("gemma4_text", "Gemma4ForCausalLM", tmp_path)
    dims = {tuple(s) for s in m["cache"]["shapes"].values()}
    assert len(dims) > 1, dims  # sliding and full layers cache different head dims
    n_layers, shared = model.config.num_hidden_layers, getattr(model.config, "num_kv_shared_layers", 0) or 0
    assert len(m["cache"]["names"]) == 2 * (n_layers - shared)


def test_model_code_errors_name_the_family():
    model = tiny("llama")

    def broken(*args, **kwargs):
        raise RuntimeError("the model's own code failed")

    model.model.forward = broken
    with pytest.raises(circle_fx.ModelError) as e:
        circle_fx.export_llm(model, max_seq_len=8, prefill_len=4, tokenizer=None)
    msg = str(e.value)
    assert "LlamaForCausalLM (model_type 'llama')" in msg and "RuntimeError: the model's own code failed" in msg
    assert "test_llm_cache_geometry.py:" in msg  # the line that raised
