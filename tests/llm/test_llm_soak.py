"""Soak: one LLMRunner generating 10,000 tokens across 100 prompts (reset between them) gives
the same tokens as fresh runners, and its resident memory does not grow after the first prompt."""
from __future__ import annotations

import os

import numpy as np
import pytest

import circle_fx
from circle_fx.llm import LLMRunner
from llm_models import tiny


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
def test_one_runner_for_100_prompts(tmp_path):
    pkg = circle_fx.export_llm(tiny("llama"), max_seq_len=128, prefill_len=8).save(str(tmp_path / "pkg"))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 128, size=int(rng.integers(1, 29))).tolist() for _ in range(100)]
    runner = LLMRunner(pkg)
    got, rss = [], []
    for p in prompts:  # short prompts go through decode steps, longer ones through prefill
        runner.reset()
        got.append(runner.generate(p, 100, eos_token_ids=[]))
        rss.append(rss_bytes())
    assert sum(len(o) - len(p) for o, p in zip(got, prompts)) == 10_000
    growth = max(rss[1:]) - rss[0]
    assert growth < 1 << 20, f"resident memory grew by {growth / 2**20:.2f} MiB after the first prompt"
    for p, o in zip(prompts, got):
        assert LLMRunner(pkg).generate(p, 100, eos_token_ids=[]) == o
