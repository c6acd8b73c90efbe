"""Decoders whose forward takes no ``position_ids`` (Marian, Pegasus, Blenderbot,
BigBird-Pegasus) derive their positions from the cache: ``arange(seq_len) +
cache.get_seq_length()``. ``GraphCache.get_seq_length`` answers the decode model's run-time
``position`` input, so every decode step embeds its own position (with 0 every step took
position 0: Marian / Pegasus generated other tokens from the second one). Runs in onert and
compares with transformers' greedy generate, through the prefill model and through decode
steps only."""
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
NEW, S, P = 6, 16, 4


@pytest.mark.slow
@pytest.mark.parametrize("family, cls", [("marian", "MarianForCausalLM"), ("blenderbot", "BlenderbotForCausalLM")])
def test_positions_from_cache_length_generate_exactly(family, cls, tmp_path):
    model = hf.build(family, cls, decoder=True)
    model.config.use_cache = model.generation_config.use_cache = True
    assert "position_ids" not in model.model.decoder.forward.__code__.co_varnames  # the case under test
    pkg = circle_fx.export_llm(model, max_seq_len=S, prefill_len=P, tokenizer=None)
    pkg.save(tmp_path)
    assert_generates_like_transformers(pkg.runner(), model, PROMPTS, NEW, logit_tol=1e-3, label=family)


@pytest.mark.slow
def test_mpt_alibi_by_key_slot_generates_exactly(tmp_path):
    """MPT slices its ALiBi bias by key length: with the new K/V row appended after the cache it
    sat S - position slots from its true place; ``slot_dependent`` finds that, and the decode
    step writes the row at its position instead (Llama keeps the append)."""
    from circle_fx.llm.cache import probe_caches, slot_dependent
    from circle_fx.llm.export import model_spec

    llama = hf.build("llama", "LlamaForCausalLM", decoder=True)
    spec = model_spec(llama, S, P)
    spec.caches = probe_caches(llama, spec)
    assert not slot_dependent(llama, spec)
    model = hf.build("mpt", "MptForCausalLM", decoder=True)
    model.config.use_cache = model.generation_config.use_cache = True
    pkg = circle_fx.export_llm(model, max_seq_len=S, prefill_len=P, tokenizer=None)
    pkg.save(tmp_path)
    assert_generates_like_transformers(pkg.runner(), model, PROMPTS, NEW, logit_tol=1e-3, label="mpt")
