"""Decoders that cannot carry a cache through the decode model get one that recomputes the
whole ``max_seq_len`` window each step (manifest ``decode.recompute``): GPT-1's forward takes
no cache; MVP derives its positions from the cache length as a Python number
(``arange(cache_length, ...)``), so a decode step captured without a run-time length would put
every token at position 0 (its tokens used to match transformers by luck, its logits did not).
Both now generate transformers' exact tokens from the same logits; a model whose logits depend
on later tokens cannot be recomputed over a padded window and is refused."""
from __future__ import annotations

import os
import sys

import pytest

import circle_fx
from circle_fx.errors import InputError
from llm_models import generates_like_transformers, tiny

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import hf_families as hf  # noqa: E402


def _spec(model):
    from circle_fx.llm.cache import probe_caches
    from circle_fx.llm.export import model_spec

    spec = model_spec(model, 16, 4)
    spec.caches = probe_caches(model, spec)
    return spec


def test_decode_position_check_tells_mvp_from_llama():
    """Eager, no export: a decode step that answers ``get_seq_length`` with 0 is still exact for
    Llama (given ``position_ids``) and wrong for MVP and RoFormer (positions from that length)."""
    from circle_fx.llm.cache import decode_matches_prefill

    llama = tiny("llama")
    assert decode_matches_prefill(llama, _spec(llama), past_length_input=False)
    for family, cls in (("mvp", "MvpForCausalLM"), ("roformer", "RoFormerForCausalLM")):
        model = hf.build(family, cls, decoder=True)  # RoFormer's logits move by ~7e-5 only: the check is tight
        assert not decode_matches_prefill(model, _spec(model), past_length_input=False), family


@pytest.mark.slow
def test_mvp_recomputes_and_generates_exactly(tmp_path):
    m = generates_like_transformers(hf.build("mvp", "MvpForCausalLM", decoder=True), tmp_path)
    assert "positions" in m["decode"]["recompute"]["why"] and m["cache"]["names"] == []
    assert [e["name"] for e in m["decode"]["inputs"]] == ["input_ids", "last_index"]
    assert m["decode"]["inputs"][0]["shape"] == [1, 16]


@pytest.mark.slow
def test_gpt1_without_cache_generates_exactly(tmp_path):
    m = generates_like_transformers(hf.build("openai-gpt", "OpenAIGPTLMHeadModel", decoder=True), tmp_path)
    assert "takes no cache" in m["decode"]["recompute"]["why"]


def test_non_causal_model_is_refused():
    """XLNet's default attention is two-way: a padded window would change the logits."""
    model = hf.build("xlnet", "XLNetLMHeadModel", decoder=True)
    with pytest.raises(InputError, match="not a causal decoder"):
        circle_fx.export_llm(model, max_seq_len=8, prefill_len=4, tokenizer=None)


def test_decode_self_check_finds_state_the_cache_misses():
    """Eager, no export: RecurrentGemma keeps its recurrent state in its own modules (two
    identical decode steps differ: an exported step would freeze that state); Zaya's decode
    steps through the cache drift from a whole-prompt forward. Both used to export with the
    same tokens as transformers from logits 0.2-0.3 off; Llama passes."""
    from circle_fx.llm.cache import decode_self_check

    llama = tiny("llama")
    assert decode_self_check(llama, _spec(llama), past_length_input=True) is None
    model = hf.build("recurrent_gemma", "RecurrentGemmaForCausalLM", decoder=True)
    assert "outside the cache" in decode_self_check(model, _spec(model), past_length_input=True)
    model = hf.build("zaya", "ZayaForCausalLM", decoder=True)
    assert "whole-prompt forward" in decode_self_check(model, _spec(model), past_length_input=True)


@pytest.mark.slow
def test_recurrent_gemma_recomputes_and_generates_exactly(tmp_path):
    m = generates_like_transformers(hf.build("recurrent_gemma", "RecurrentGemmaForCausalLM", decoder=True), tmp_path)
    assert "outside the cache" in m["decode"]["recompute"]["why"]
