"""Sparse attention with an indexer (``indexed_attention`` layers: DeepSeek-V3.2, GLM-MoE-DSA,
HY-V4, AXK2, dots3): the indexer's keys reach transformers' cache through
``Cache.update_indexer``; export_llm carries them as one more state written at positions (as
K/V), and the indexer's own top-k picks the keys each token attends to. With ``index_topk``
smaller than the prompt the selection really drops keys, so a wrong indexer cache changes the
tokens."""
from __future__ import annotations

import os
import sys

import pytest
from llm_models import generates_like_transformers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import hf_families as hf  # noqa: E402


@pytest.mark.slow
def test_deepseek_v32_indexer_generates_exactly(tmp_path):
    model = hf.build("deepseek_v32", "DeepseekV32ForCausalLM", decoder=True)
    indexers = [m for m in model.modules() if hasattr(m, "index_topk")]
    assert indexers
    for m in indexers:
        m.index_topk = 2  # fewer than the prompt's tokens: the sparse selection matters
    m = generates_like_transformers(model, tmp_path)
    states = {s["name"]: s for s in m["cache"]["states"]}
    idx = [s for s in states.values() if s["kind"] == "indexer"]
    assert len(idx) == model.config.num_hidden_layers and all(s["carry"] == "position" for s in idx)
    assert idx[0]["shape"][:3] == [1, 1, 16]
