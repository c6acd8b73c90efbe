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

import numpy as np
import pytest
import torch

import circle_fx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import hf_families as hf  # noqa: E402

PROMPTS = ([5, 17, 9], [5, 17, 9, 33, 42, 100, 7])  # shorter and longer than P
NEW, S, P, CHUNK = 6, 16, 4, 4


def _reference(model, ids):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                             pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    return out.sequences[0].tolist(), [s[0].numpy() for s in out.scores]


@pytest.mark.slow
def test_llama4_chunked_attention_generates_exactly(tmp_path):
    model = hf.build("llama4_text", "Llama4ForCausalLM", decoder=True)
    model.config.use_cache = model.generation_config.use_cache = True
    assert model.config.attention_chunk_size == CHUNK and "chunked_attention" in model.config.layer_types
    pkg = circle_fx.export_llm(model, max_seq_len=S, prefill_len=P, tokenizer=None)
    assert pkg.manifest["attention_chunk"] == CHUNK
    pkg.save(tmp_path)
    runner = pkg.runner()
    for ids in PROMPTS:
        want, scores = _reference(model, ids)
        for use_prefill in (True, False):
            got, logits = runner.generate(ids, NEW, eos_token_ids=[], return_logits=True, use_prefill=use_prefill)
            assert got == want, f"prompt {ids} prefill={use_prefill}: {got[len(ids):]} vs {want[len(ids):]}"
            diff = max(float(np.abs(g - s).max()) for g, s in zip(logits, scores))
            assert diff < 1e-4, f"prompt {ids} prefill={use_prefill}: logits differ by {diff}"
