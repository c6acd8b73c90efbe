"""Sliding-window layers keep and read only their window (issue 32 item 4): each sliding layer's
K/V is a ring of ``window - 1`` rows (transformers' window is the token and the ``window - 1``
positions before it), written by the host at ``position % rows``; full-attention layers keep
``max_seq_len`` rows. Tokens and logits must equal transformers' greedy generation past the
window, for a prompt shorter and longer than the window, through the prefill and decode steps
only, across decode / prefill buckets; the cache shapes must be the ring's (so the old form fails)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import circle_fx
from circle_fx.llm import LLMRunner
from llm_models import greedy_reference, tiny

S, P, W = 64, 16, 8
NEW = 30
PROMPTS = ([5, 17, 9, 33, 42],  # shorter than the window
           [5, 17, 9, 33, 42, 100, 7, 8, 9, 10, 11, 12, 13],  # longer than the window, inside the prefill
           [(7 * k + 3) % 120 + 3 for k in range(20)])  # longer than the prefill: 16 prefilled, 4 decode steps


def _mistral(window=W):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=window)
    model = MistralForCausalLM(cfg).eval()
    model.config.use_cache = model.generation_config.use_cache = True
    return model


def _states(m):
    return {s["name"]: s for s in m["cache"]["states"]}


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    model = _mistral()
    d = str(tmp_path_factory.mktemp("ring_mistral"))
    # a decode bucket smaller than the ring (4 < 7 rows) and one larger (16): both read the ring
    pkg = circle_fx.export_llm(model, max_seq_len=S, prefill_len=P, tokenizer=None,
                               buckets={"decode": [4, 16], "prefill": [8]})
    pkg.save(d)
    return model, d, pkg


def test_mistral_caches_are_rings_of_the_window(mistral):
    _, d, _ = mistral
    m = LLMRunner(d).manifest
    assert m["version"] == 3 and m["sliding_window"] == W and m["decode"]["recompute"] is None
    states = _states(m)
    assert states and all(s["carry"] == "ring" and s["ring"] == W - 1 and s["window"] == W for s in states.values())
    assert all(s["shape"] == [1, 2, W - 1, 8] for s in states.values())
    assert m["cache"]["bytes"] == sum(4 * int(np.prod(s["shape"])) for s in states.values())
    assert m["model"]["num_kv_heads"] == 2 and m["model"]["head_dim"] == 8
    dec_in = {e["name"]: e for e in m["decode"]["inputs"]}
    for name in states:  # the decode entry point (every bucket behind it) takes W - 1 rows
        assert dec_in[name]["shape"] == [1, 2, W - 1, 8]
    writes = {w["cache"]: w for w in m["decode"]["cache_writes"]}
    assert all(w["carry"] == "ring" and w["ring"] == W - 1 and w["first_position"] == "position" for w in writes.values())
    assert LLMRunner(d).caches["key_cache_0"].shape == (1, 2, W - 1, 8)


def test_mistral_generates_like_transformers_past_the_window(mistral):
    model, d, _ = mistral
    greedy_reference().assert_generates_like_transformers(LLMRunner(d), model, PROMPTS, NEW, label="mistral ring")


def test_prefill_leaves_the_last_rows_in_ring_order(mistral):
    """After a 13-id prompt (> the 7-row ring) slot s holds the position q in 6..12 with q % 7 == s:
    the prefill's own output row q (compared with the prefill output the runner read)."""
    _, d, _ = mistral
    r = LLMRunner(d)
    ids = PROMPTS[1]
    r.reset()
    r.run_prefill(ids)
    out = r.prefill.output(r._pout["key_0"])
    n, R = len(ids), W - 1
    for q in range(n - R, n):
        np.testing.assert_array_equal(r.caches["key_cache_0"][:, :, q % R, :], out[:, :, q, :])


def test_two_file_layout_with_rings_is_version_3(mistral, tmp_path):
    """save(layout="two") of a ring package: prefill.circle + decode.circle under version 3 (a version-1
    reader would take a ring for a replaced state), read back by the two-file path, the same tokens."""
    _, d, pkg = mistral
    two = tmp_path / "two"
    pkg.save(two, layout="two")
    m = json.loads((two / "manifest.json").read_text())
    assert m["version"] == 3 and "file" not in m and m["decode"]["file"] == "decode.circle"
    r = LLMRunner(two)
    assert r.prefill is not r.decode  # two sessions
    ids = PROMPTS[1]
    assert r.generate(ids, 12, eos_token_ids=[]) == LLMRunner(d).generate(ids, 12, eos_token_ids=[])


def test_window_not_below_max_seq_len_keeps_full_caches(tmp_path):
    """A window >= max_seq_len bounds nothing: caches keep max_seq_len rows, written at the position."""
    m = circle_fx.export_llm(_mistral(window=32), max_seq_len=24, prefill_len=8, tokenizer=None).manifest
    assert {(s["carry"], s["shape"][s.get("axis", 2)]) for s in m["cache"]["states"]} == {("position", 24)}


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    model = tiny("gemma3")  # window 6; layers sliding, full, sliding
    model.config.use_cache = model.generation_config.use_cache = True
    d = str(tmp_path_factory.mktemp("ring_gemma3"))
    circle_fx.export_llm(model, max_seq_len=48, prefill_len=P, tokenizer=None).save(d)
    return model, d


def test_gemma3_local_layers_ring_global_layers_full(gemma3):
    model, d = gemma3
    m = LLMRunner(d).manifest
    kinds = model.config.layer_types
    window = model.config.sliding_window
    assert "full_attention" in kinds and "sliding_attention" in kinds
    assert m["decode"]["recompute"] is None and len(m["cache"]["states"]) == 2 * len(kinds)
    for s in m["cache"]["states"]:
        if kinds[s["layer"]] == "sliding_attention":
            assert s["carry"] == "ring" and s["shape"][s.get("axis", 2)] == s["ring"] == window - 1
        else:
            assert s["carry"] == "position" and s["shape"][s.get("axis", 2)] == 48
    assert m["cache"]["shape"] is None  # the states differ in rows


def test_gemma3_generates_like_transformers_past_the_window(gemma3):
    model, d = gemma3
    greedy_reference().assert_generates_like_transformers(LLMRunner(d), model, PROMPTS[:2], NEW - 2,
                                                          label="gemma3 ring")


def test_version_2_package_still_loads(tmp_path):
    """A version-2 manifest (written before rings: every K/V carried at positions) is read and run;
    the runner refuses a carry it does not know, naming the version."""
    import shutil

    model = tiny("llama")
    d = tmp_path / "v2"
    circle_fx.export_llm(model, max_seq_len=24, prefill_len=8, tokenizer=None).save(d)
    path = d / "manifest.json"
    m = json.loads(path.read_text())
    assert all(s["carry"] == "position" for s in m["cache"]["states"])
    m["version"] = 2
    path.write_text(json.dumps(m))
    model.config.use_cache = model.generation_config.use_cache = True
    greedy_reference().assert_generates_like_transformers(LLMRunner(d), model, [[5, 17, 9]], 6, label="v2")
    bad = tmp_path / "bad"
    shutil.copytree(d, bad)
    m["decode"]["cache_writes"][0]["carry"] = "spiral"
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(circle_fx.InputError, match=r"cache carry \['spiral'\].*manifest version 2"):
        LLMRunner(bad)


@pytest.mark.slow  # ~40 s: transformers' generate of 400 tokens dominates
def test_a_realistic_window_with_a_bucket_below_the_ring(tmp_path):
    """Window 300 (a 299-row ring) on a tiny Gemma-3, decode buckets 128 (below the ring: reads its
    first 128 rows) / 512 (above) / 700: a 5-id prompt + 400 tokens and a 420-id prompt (64 prefilled,
    the rest decode steps, past the window) + 60 tokens = transformers' greedy tokens and logits."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=300,
                           sliding_window_pattern=2, max_position_embeddings=1024)
    model = Gemma3ForCausalLM(cfg).eval()
    model.config.use_cache = model.generation_config.use_cache = True
    pkg = circle_fx.export_llm(model, max_seq_len=700, prefill_len=64, tokenizer=None,
                               buckets={"decode": [128, 512], "prefill": "off"})
    rows = {s["name"]: (s["carry"], s["shape"][s.get("axis", 2)]) for s in pkg.manifest["cache"]["states"]}
    assert rows["key_cache_0"] == ("ring", 299) and rows["key_cache_1"] == ("position", 700)
    runner = pkg.runner(str(tmp_path / "pkg"))
    ref = greedy_reference()
    ref.assert_generates_like_transformers(runner, model, [[5, 17, 9, 33, 42]], 400, label="window 300")
    ref.assert_generates_like_transformers(runner, model, [[(7 * k + 3) % 120 + 3 for k in range(420)]], 60,
                                           label="window 300, long prompt")


def test_rings_that_do_not_give_the_models_logits_are_not_used(monkeypatch, tmp_path):
    """The eager ring check (cache.rings_check, at a window of 3 where the ring wraps): rings one row
    short (a wrong window rule) fail it, so the package keeps max_seq_len rows with a warning, and still
    generates transformers' tokens (rather than shipping the short rings, or recomputing)."""
    import circle_fx.llm.cache as cache

    real = cache.ring_rows
    monkeypatch.setattr(cache, "ring_rows", lambda spec: None if real(spec) is None else real(spec) - 1)
    model = _mistral()
    with pytest.warns(UserWarning, match="keep max_seq_len cache rows"):
        pkg = circle_fx.export_llm(model, max_seq_len=32, prefill_len=8, tokenizer=None)
    m = pkg.manifest
    assert {(s["carry"], s["shape"][s.get("axis", 2)]) for s in m["cache"]["states"]} == {("position", 32)}
    assert m["decode"]["recompute"] is None
    greedy_reference().assert_generates_like_transformers(pkg.runner(str(tmp_path / "p")), model, [PROMPTS[1]], 12,
                                                          label="full caches")
