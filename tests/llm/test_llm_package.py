"""The LLM package: manifest vs the Circle files, save/load, and the errors users can cause."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.circle.reader import read_circle
from circle_fx.llm import LLMPackage, LLMRunner
from llm_models import tiny

S, P = 16, 4


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = tiny("llama")
    pkg = circle_fx.export_llm(model, max_seq_len=S, prefill_len=P)
    d = str(tmp_path_factory.mktemp("pkg"))
    pkg.save(d)
    return model, pkg, d


def _io(path):
    m = read_circle(path)
    return m


def test_manifest_matches_the_circle_files(saved):
    model, pkg, d = saved
    with open(os.path.join(d, "manifest.json")) as f:
        m = json.load(f)
    cfg = model.config
    assert m["max_seq_len"] == S and m["prefill_len"] == P and m["format"] == "circle_fx.llm"
    assert m["cache"]["shape"] == [1, cfg.num_key_value_heads, S, cfg.hidden_size // cfg.num_attention_heads]
    L = cfg.num_hidden_layers
    assert m["cache"]["names"] == [f"{k}_cache_{i}" for i in range(L) for k in ("key", "value")]
    dec_in = {e["name"]: e for e in m["decode"]["inputs"]}
    assert dec_in["input_ids"]["shape"] == [1, 1] and dec_in["input_ids"]["dtype"] == "int32"
    assert dec_in["position"]["shape"] == [1] and dec_in["position"]["dtype"] == "int32"
    for n in m["cache"]["names"]:
        assert dec_in[n]["shape"] == m["cache"]["shape"] and dec_in[n]["dtype"] == "float32"
    dec_out = {e["name"]: e for e in m["decode"]["outputs"]}
    assert dec_out["logits"]["shape"] == [1, 1, cfg.vocab_size]
    pre_out = {e["name"]: e for e in m["prefill"]["outputs"]}
    for w in m["decode"]["cache_writes"]:
        assert dec_out[w["output"]]["shape"] == m["cache"]["shape"][:2] + [1] + m["cache"]["shape"][3:]
        assert w["cache"] in dec_in and w["axis"] == 2 and w["first_cache_row"] == "position" and w["count"] == 1
    for w in m["prefill"]["cache_writes"]:
        assert pre_out[w["output"]]["shape"] == m["cache"]["shape"][:2] + [P] + m["cache"]["shape"][3:]
        assert w["first_cache_row"] == 0 and w["count"] == "length"
    # the slots in the manifest are the file's real input/output order and names: one session
    # (subgraph 0, the IF dispatch) takes the entry flag and every entry point's inputs
    from circle_fx.circle.runtime import OnertSession

    assert m["version"] == 3 and m["file"] == "model.circle" and m["entry"]["index"] == 0
    sess = OnertSession(os.path.join(d, m["file"])).session.session
    assert sess.input_size() == 1 + len(m["prefill"]["inputs"]) + len(m["decode"]["inputs"])
    assert sess.output_size() == len(m["prefill"]["outputs"]) + len(m["decode"]["outputs"])
    for part in ("decode", "prefill"):
        for e in m[part]["inputs"]:
            info = sess.input_tensorinfo(e["index"])
            assert list(info.dims[:info.rank]) == e["shape"], (part, e)
        # each entry point is a subgraph with the SignatureDef ONE's runner looks up (merge.circles.py)
        cf = read_circle(os.path.join(d, m["file"]), subgraph=m[part]["subgraph"])
        assert (part, m[part]["subgraph"]) in cf.signatures
        other = "decode." if part == "prefill" else "prefill."  # an IF branch takes every IF input
        own = [n for n, _ in cf.signature_inputs if not n.startswith(other)]
        assert own == [e["name"] for e in m[part]["inputs"]]


def test_one_file_stores_each_weight_once(saved, tmp_path):
    """model.circle holds both entry points' weights once: the two version-1 files (each with
    every weight) minus one copy of the weights. (On this tiny model the operator and tensor
    tables are a third of the bytes; SmolLM2's numbers are in docs/llm-package.md.)"""
    model, pkg, d = saved
    pkg.save(tmp_path / "two", layout="two")
    one = os.path.getsize(os.path.join(d, "model.circle"))
    pre, dec = (os.path.getsize(tmp_path / "two" / f) for f in ("prefill.circle", "decode.circle"))
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert one <= pre + dec - 0.9 * weights, (one, pre, dec, weights)
    assert sum(b.nbytes for b in pkg.model.builder.constants()) <= 1.03 * weights
    assert json.load(open(os.path.join(d, "config.json")))["num_hidden_layers"] == model.config.num_hidden_layers


def test_old_packages_still_run(saved, tmp_path):
    """A version-1 package (prefill.circle + decode.circle, two sessions) generates the same
    tokens; an unknown version is refused naming it."""
    model, pkg, d = saved
    old = tmp_path / "old"
    pkg.save(old, layout="two")
    assert json.load(open(old / "manifest.json"))["version"] == 1
    ids = [3, 4, 5, 6, 7]
    assert LLMRunner(old).generate(ids, 6, eos_token_ids=[]) == LLMRunner(d).generate(ids, 6, eos_token_ids=[])
    m = json.load(open(old / "manifest.json"))
    m["version"] = 7
    json.dump(m, open(old / "manifest.json", "w"))
    with pytest.raises(circle_fx.InputError, match="version 7; this circle_fx reads 'circle_fx.llm' versions 1, 2, 3"):
        LLMRunner(old)


def test_load_and_save_elsewhere(saved, tmp_path):
    model, pkg, d = saved
    loaded = LLMPackage.load(d)
    assert loaded.manifest == pkg.manifest and loaded.decode is None
    loaded.save(tmp_path / "copy")
    assert sorted(os.listdir(tmp_path / "copy")) == ["config.json", "generation_config.json", "manifest.json", "model.circle"]
    ids = torch.tensor([[3, 4, 5]])
    want = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None)[0].tolist()
    assert LLMRunner(tmp_path / "copy").generate(ids, 8, eos_token_ids=[]) == want


def test_eos_stops_generation(saved):
    model, pkg, d = saved
    r = LLMRunner(d)
    full = r.generate([3, 4], 10, eos_token_ids=[])
    stop = full[4]  # the third new token
    assert r.generate([3, 4], 10, eos_token_ids=[stop])[-1] == stop
    assert len(r.generate([3, 4], 10, eos_token_ids=[stop])) <= 5


def test_errors(saved, tmp_path):
    model, pkg, d = saved
    r = LLMRunner(d)
    with pytest.raises(circle_fx.InputError, match="max_seq_len 16"):
        r.generate(list(range(17)), 1)  # prompt longer than the cache
    with pytest.raises(circle_fx.InputError, match="needs 20 cache positions"):
        r.generate(list(range(10)), 11)
    with pytest.raises(circle_fx.InputError, match="position 16 is past the KV cache"):
        r.step(1, 16)
    with pytest.raises(circle_fx.InputError, match="token ids must be in 0..127"):
        r.generate([500], 2)
    with pytest.raises(circle_fx.InputError, match="batch size 2"):
        r.generate(torch.zeros(2, 3, dtype=torch.long), 2)
    with pytest.raises(circle_fx.InputError, match="no such directory"):
        LLMRunner(tmp_path / "missing")
    with pytest.raises(circle_fx.InputError, match="no manifest.json"):
        LLMRunner(tmp_path)
    broken = tmp_path / "broken"
    LLMPackage.load(d).save(broken)
    os.unlink(broken / "model.circle")
    with pytest.raises(circle_fx.InputError, match="model.circle is missing"):
        LLMRunner(broken)


def test_export_errors():
    model = tiny("llama")
    with pytest.raises(circle_fx.InputError, match="max_seq_len"):
        circle_fx.export_llm(model, max_seq_len=1)
    with pytest.raises(circle_fx.InputError, match="prefill_len"):
        circle_fx.export_llm(model, max_seq_len=8, prefill_len=9)
    with pytest.raises(circle_fx.InputError, match="causal LM"):
        circle_fx.export_llm(torch.nn.Linear(3, 3), max_seq_len=8)
    with pytest.raises(circle_fx.UnsupportedDtypeError, match="model.float"):
        circle_fx.export_llm(tiny("llama").to(torch.bfloat16), max_seq_len=8)


def test_eager_attention_gets_an_additive_mask(tmp_path):
    """attn_implementation="eager" adds the mask to the scores: export_llm builds a float mask for it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM._from_config(cfg, attn_implementation="eager").eval()
    assert model.config._attn_implementation == "eager"
    runner = circle_fx.export_llm(model, max_seq_len=S, prefill_len=P).runner(str(tmp_path / "eager"))
    ids = torch.tensor([[7, 8, 9, 10, 11, 12]])
    want = model.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=None)[0].tolist()
    assert runner.generate(ids, 10, eos_token_ids=[]) == want


def test_single_mask_sliding_window_mistral(tmp_path):
    """Mistral has no per-layer types: one mask for every layer, sliding (window 4 < context)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=4)
    model = MistralForCausalLM(cfg).eval()
    pkg = circle_fx.export_llm(model, max_seq_len=24, prefill_len=6)
    assert pkg.manifest["sliding_window"] == 4
    ids = torch.tensor([[5, 17, 9, 33, 2, 100, 7, 8]])
    want = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)[0].tolist()
    assert pkg.runner(str(tmp_path / "mistral")).generate(ids, 12, eos_token_ids=[]) == want


def test_auto_prefill_choice(saved):
    """A short prompt in a long prefill model goes through decode steps (the padded prefill
    would compute every row); a prompt filling the prefill model uses it."""
    r = LLMRunner(saved[2])
    r.prefill_len = 128  # the cost rule only (prefill ~ 5 + 0.08 * 128 = 15 decode steps)
    assert not r.prefill_pays(1) and not r.prefill_pays(14)
    assert r.prefill_pays(16) and r.prefill_pays(128) and r.prefill_pays(500)
    r.prefill_buckets = [8, 32, 128]  # prefill buckets: the call computes the smallest that holds the prompt
    assert r.prefill_pays(8) and not r.prefill_pays(5) and r.prefill_pays(14)


def test_rope_op_false_keeps_rope_decomposed(saved, tmp_path):
    model = saved[0]
    pkg = circle_fx.export_llm(model, max_seq_len=S, prefill_len=P, rope_op=False)
    assert pkg.decode.op_histogram()["ROPE"] == 0 and saved[1].decode.op_histogram()["ROPE"] == 4
    ids = torch.tensor([[3, 4, 5]])
    want = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=None)[0].tolist()
    assert pkg.runner(str(tmp_path / "norope")).generate(ids, 8, eos_token_ids=[]) == want
