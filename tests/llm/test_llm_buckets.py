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
from llm_models import generates_like_transformers, tiny

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
def packages(tmp_path_factory):
    model = tiny("llama")
    model.config.use_cache = model.generation_config.use_cache = True
    out = {}
    for name, b in (("buckets", BUCKETS), ("single", "off")):
        d = str(tmp_path_factory.mktemp(name))
        circle_fx.export_llm(model, max_seq_len=S, prefill_len=P, tokenizer=None, buckets=b).save(d)
        out[name] = d
    return model, out


def test_buckets_generate_like_transformers_across_boundaries(packages):
    model, d = packages
    m = LLMRunner(d["buckets"]).manifest
    assert m["decode"]["buckets"]["lengths"] == [8, 16, 24] and m["prefill"]["buckets"]["lengths"] == [4, 8]
    # prompts ending in both prefill buckets and in decode steps; generation crosses positions 8 and 16
    prompts = ([5, 17, 9], [5, 17, 9, 33, 42, 100, 7], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    ref = generates_like_transformers  # noqa: F841  (the same comparison as every family's)
    from llm_models import greedy_reference

    greedy_reference().assert_generates_like_transformers(LLMRunner(d["buckets"]), model, prompts, S - 10)
    a, b = LLMRunner(d["buckets"]), LLMRunner(d["single"])
    for ids in prompts:
        ta, la = a.generate(ids, S - len(ids), eos_token_ids=[], return_logits=True)
        tb, lb = b.generate(ids, S - len(ids), eos_token_ids=[], return_logits=True)
        assert ta == tb
        assert max(float(np.abs(x - y).max()) for x, y in zip(la, lb)) < 1e-4


def test_a_step_reads_only_its_bucket(packages):
    """NaN in the cache rows 8..23: a step at position 5 runs the 8-row bucket and never reads them
    (finite logits, equal to the clean cache's); at position 12 the 16-row bucket reads rows 8..15
    (NaN) but not 16..23; the single-bucket package reads every row (NaN at position 5 too)."""
    _, d = packages
    clean = {}
    for name in ("buckets", "single"):
        r = LLMRunner(d[name])
        r.run_prefill([5, 17, 9, 33, 42])
        clean[name] = r.step(7, 5).copy()
        for c in r.caches.values():
            c[:, :, 16:, :] = np.nan
        x16 = r.step(7, 5).copy()
        for c in r.caches.values():
            c[:, :, 8:, :] = np.nan
        x8 = r.step(7, 5).copy()
        if name == "buckets":
            assert np.isfinite(x8).all() and np.allclose(x8, clean[name], atol=1e-5)
            assert np.isfinite(x16).all()
            for c in r.caches.values():
                c[:, :, 8:16, :] = 0.0  # rows 8..15 clean, 16..23 NaN: position 12 runs the 16-row bucket
            assert np.isfinite(r.step(7, 12)).all()
        else:
            assert np.isnan(x8).all() and np.isnan(x16).all()
    np.testing.assert_allclose(clean["buckets"], clean["single"], atol=1e-5)


def test_a_short_prompt_computes_only_its_prefill_bucket(packages):
    """The 4-id bucket pads its K/V outputs with zeros past its length (the 8-id prefill computes
    the padding's rows): it ran, and only it."""
    _, d = packages
    for name in ("buckets", "single"):
        r = LLMRunner(d[name])
        r.run_prefill([5, 17, 9])
        m = r.manifest
        rows = r.prefill.output(r._pout[m["prefill"]["cache_writes"][0]["output"]])
        assert rows.shape[2] == P
        assert (np.abs(rows[:, :, 4:, :]).max() == 0) == (name == "buckets")
        assert np.abs(rows[:, :, :3, :]).max() > 0


def test_package_without_bucket_entries_loads(packages, tmp_path):
    """A version-2 package written before buckets (no ``buckets`` in its manifest) still generates."""
    import shutil

    _, d = packages
    old = str(tmp_path / "old")
    shutil.copytree(d["single"], old)
    path = os.path.join(old, "manifest.json")
    m = json.load(open(path))
    for part in ("prefill", "decode"):
        m[part].pop("buckets")
    json.dump(m, open(path, "w"))
    assert LLMRunner(old).generate([5, 17, 9], 4, eos_token_ids=[]) == \
        LLMRunner(d["single"]).generate([5, 17, 9], 4, eos_token_ids=[])


@pytest.mark.parametrize("family", ["gemma3", "lfm2"])
def test_bucketed_families_generate_like_transformers(family, tmp_path):
    """Sliding-window layers (Gemma 3, window 6 < the 8-row bucket) and a conv state (LFM2: no
    prefill buckets, a padded prompt would corrupt the state; decode buckets as any model)."""
    m = generates_like_transformers(tiny(family), str(tmp_path), max_seq_len=S, prefill_len=P,
                                    buckets=BUCKETS, prompts=([5, 17, 9], [5, 17, 9, 33, 42, 100, 7, 8, 9]), new=12)
    assert m["decode"]["buckets"]["lengths"] == [8, 16, 24]
    assert m["prefill"]["buckets"]["lengths"] == ([8] if family == "lfm2" else [4, 8])
