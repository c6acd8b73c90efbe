"""Decode cache-length buckets and prefill lengths (issue 32 items 3, 4): several entry points
sharing every weight in model.circle, one chosen in the graph by an IF chain on ``position`` /
``last_index``. They must give transformers' greedy tokens across bucket boundaries, really run
the small bucket (a step at position 5 must not read cache row 12), and leave old packages loadable."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import circle_fx
from circle_fx.errors import InputError
from circle_fx.llm import LLMRunner
from circle_fx.llm.export import bucket_lengths
from llm_models import generates_like_transformers, greedy_reference, tiny

S, P = 24, 8
BUCKETS = {"decode": [8, 16], "prefill": [4]}  # decode 8/16/24, prefill 4/8


def test_bucket_lengths():
    # auto: powers of 4 below the totals; small packages (every other test's) get one bucket each
    assert bucket_lengths("auto", 4096, 512) == ([256, 1024, 4096], [32, 128, 512])
    assert bucket_lengths("auto", 2048, 2048) == ([256, 1024, 2048], [32, 128, 512, 2048])
    assert bucket_lengths("auto", 256, 128) == ([256], [128])
    assert bucket_lengths("auto", 128, 128) == ([128], [128])
    assert bucket_lengths("off", 4096, 512) == ([4096], [512]) == bucket_lengths(None, 4096, 512)
    assert bucket_lengths({"decode": [100, 10]}, 400, 300) == ([10, 100, 400], [32, 128, 300])
    assert bucket_lengths({"decode": "off", "prefill": [64, 256]}, 4096, 256) == ([4096], [64, 256])
    for bad in ({"decode": [0]}, {"decode": [5000]}, {"prefill": ["x"]}, {"dec": [4]}, "on", 3):
        with pytest.raises(InputError):
            bucket_lengths(bad, 4096, 512)


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    model = tiny("llama")
    model.config.use_cache = model.generation_config.use_cache = True
    d = str(tmp_path_factory.mktemp("buckets"))
    circle_fx.export_llm(model, max_seq_len=S, prefill_len=P, tokenizer=None, buckets=BUCKETS).save(d)
    return model, d


def test_buckets_generate_like_transformers_across_boundaries(package):
    model, d = package
    m = LLMRunner(d).manifest
    assert m["decode"]["buckets"]["lengths"] == [8, 16, 24] and m["prefill"]["buckets"]["lengths"] == [4, 8]
    assert m["decode"]["buckets"]["selector"] == "position" and m["prefill"]["buckets"]["selector"] == "last_index"
    # prompts ending in both prefill buckets and in decode steps; generation crosses positions 8 and 16;
    # through the prefill and through decode steps only, logits within greedy_reference's tolerance
    prompts = ([5, 17, 9], [5, 17, 9, 33, 42, 100, 7], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    greedy_reference().assert_generates_like_transformers(LLMRunner(d), model, prompts, S - 10)


def test_a_step_reads_only_its_bucket(package):
    """NaN in cache rows 8..23: a step at position 5 runs the 8-row bucket and never reads them
    (finite logits, equal to the clean cache's), while any step that read them would be NaN (the
    masked rows' scores are NaN, and 0 x NaN in the value product too); at position 12 the 16-row
    bucket reads rows 8..15 but not 16..23."""
    _, d = package
    r = LLMRunner(d)
    r.run_prefill([5, 17, 9, 33, 42])
    clean = r.step(7, 5).copy()
    axis = {s["name"]: s.get("axis", 2) for s in r.manifest["cache"]["states"]}  # values: [1, H, D, S]

    def rows(name, lo, hi):
        return (slice(None),) * axis[name] + (slice(lo, hi),)

    for n, c in r.caches.items():
        c[rows(n, 8, None)] = np.nan
    np.testing.assert_allclose(r.step(7, 5), clean, atol=1e-5)
    assert np.isnan(r.step(7, 8)).all()  # position 8 runs the 16-row bucket, which reads the NaN rows
    for n, c in r.caches.items():
        c[rows(n, 8, 16)] = 0.0
    assert np.isfinite(r.step(7, 12)).all()
    assert np.isnan(r.step(7, 16)).all()  # the full bucket


def test_a_short_prompt_computes_only_its_prefill_bucket(package):
    """A 3-id prompt runs the 4-id bucket, whose K/V outputs are zeros past its length; a 5-id
    prompt runs the 8-id bucket, which computes the padding's rows too."""
    _, d = package
    r = LLMRunner(d)
    out = r._pout[r.manifest["prefill"]["cache_writes"][0]["output"]]
    for n, zeros_from in ((3, 4), (5, None)):
        r.run_prefill([5, 17, 9, 33, 42][:n])
        rows = r.prefill.output(out)
        assert rows.shape[2] == P and np.abs(rows[:, :, :n, :]).max() > 0
        assert (np.abs(rows[:, :, 4:, :]).max() == 0) == (zeros_from == 4)


def test_package_without_bucket_entries_loads(package, tmp_path):
    """A version-2 package written before buckets (no ``buckets`` in its manifest) is driven as before."""
    import shutil

    _, d = package
    old = str(tmp_path / "old")
    shutil.copytree(d, old)
    path = os.path.join(old, "manifest.json")
    m = json.load(open(path))
    for part in ("prefill", "decode"):
        m[part].pop("buckets")
    json.dump(m, open(path, "w"))
    assert LLMRunner(old).prefill_buckets == [P]
    assert LLMRunner(old).generate([5, 17, 9], 8, eos_token_ids=[]) == LLMRunner(d).generate([5, 17, 9], 8,
                                                                                              eos_token_ids=[])


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma3", "lfm2"])
def test_bucketed_families_generate_like_transformers(family, tmp_path):
    """Sliding-window layers (Gemma 3, window 6 < the 8-row bucket) and a conv state (LFM2: no
    prefill buckets, a padded prompt would corrupt the state; decode buckets as any model)."""
    m = generates_like_transformers(tiny(family), str(tmp_path), max_seq_len=S, prefill_len=P,
                                    buckets=BUCKETS, prompts=([5, 17, 9], [5, 17, 9, 33, 42, 100, 7, 8, 9]), new=12)
    assert m["decode"]["buckets"]["lengths"] == [8, 16, 24]
    assert m["prefill"]["buckets"]["lengths"] == ([8] if family == "lfm2" else [4, 8])


@pytest.mark.parametrize("error", ["CaptureError", "UnsupportedOpError", "RuntimeError"])
def test_a_bucket_that_cannot_be_captured_leaves_one_entry_point(monkeypatch, tmp_path, error):
    """If a bucket fails (the model's code in its capture, a lowering, anything else) and the full step
    did not, the package keeps the full decode step alone, warns, and still generates transformers'
    tokens (not a recompute package, not a failed export)."""
    from circle_fx import errors
    from circle_fx.llm import export as ex

    def fail(*a, **k):
        raise getattr(errors, error, RuntimeError)("bucket failed (test)")

    monkeypatch.setattr(ex, "_capture_decode_bucket", fail)
    model = tiny("llama")
    with pytest.warns(UserWarning, match="no decode buckets"):
        pkg = circle_fx.export_llm(model, max_seq_len=16, prefill_len=4, tokenizer=None, buckets={"decode": [8]})
    assert pkg.manifest["decode"]["buckets"]["lengths"] == [16]
    r = pkg.runner(str(tmp_path / "p"))
    want = model.generate(__import__("torch").tensor([[5, 17, 9]]), max_new_tokens=6, do_sample=False,
                          eos_token_id=None)[0].tolist()
    assert r.generate([5, 17, 9], 6, eos_token_ids=[]) == want
