"""docs/generation-support.json (scripts/generation_support.py) was generated from this
transformers: one row per enumerated causal-LM family, each with a status and, unless it
generates exactly, the reason."""
from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import hf_families as hf  # noqa: E402


def test_generation_table_covers_every_enumerated_family():
    with open(os.path.join(ROOT, "docs", "generation-support.json")) as fh:
        rows = json.load(fh)
    recorded = {r["family"] for r in rows}
    current = {f.model_type for f in hf.enumerate_families()}
    assert recorded == current, (sorted(current - recorded), sorted(recorded - current))
    assert all(r["status"] == "ok" or r.get("reason") for r in rows), [r["family"] for r in rows if not r.get("reason")
                                                                        and r["status"] != "ok"]
