"""Chunked attention (Llama 4's ``chunked_attention`` layers: a token attends to the earlier
tokens of its own chunk of ``attention_chunk_size`` positions) is one more per-layer-type mask,
built like the sliding-window one from compile-time index vectors (prefill: transformers'
``chunked_overlay``; decode: ``position < end of row j's chunk``); the decode step's RoPE
``torch.polar`` of a run-time angle becomes real cos / sin pairs (``passes/complex_to_real``).
Runs in onert and compares with transformers' greedy generate: a chunk of 4 positions, so
prompt and new tokens cross several chunk boundaries."""
from __future__ import annotations

import os
import sys

import pytest

import circle_fx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import hf_families as hf  # noqa: E402
from greedy_reference import assert_generates_like_transformers  # noqa: E402

PROMPTS = ([5, 17, 9], [5, 17, 9, 33, 42, 100, 7])  # shorter and longer than P
NEW, S, P, CHUNK = 6, 16, 4, 4


@pytest.mark.slow
def test_llama4_chunked_attention_generates_exactly(tmp_path):
    model = hf.build("llama4_text", "Llama4ForCausalLM", decoder=True)
    model.config.use_cache = model.generation_config.use_cache = True
    assert model.config.attention_chunk_size == CHUNK and "chunked_attention" in model.config.layer_types
    pkg = circle_fx.export_llm(model, max_seq_len=S, prefill_len=P, tokenizer=None)
    assert pkg.manifest["attention_chunk"] == CHUNK
    pkg.save(tmp_path)
    assert_generates_like_transformers(pkg.runner(), model, PROMPTS, NEW, logit_tol=1e-4)
