"""Sliding-window layers as ring caches (issue 32 item 4): KV bytes and decode ms/token, before / after.

A tiny Gemma-3 text config with Gemma-3-1B's attention geometry (1 KV head, head_dim 256, window 512, five
local layers per global one; 6 layers, hidden 256, vocab 1024, random weights), exported with
``max_seq_len`` 4096 (prefill_len 32, buckets "auto": decode 256 / 1024 / 4096 cache rows) by two circle_fx
trees: ``--before`` (default /work/main: every layer keeps 4096 rows) and this one (local layers keep rings
of 511 rows). Each package: KV bytes from its manifest's shapes; then, interleaved over ``--rounds``, a fresh
process per package (onert + numpy) times decode steps at positions 100 / 1000 / 4000 (median of 5 from
there, caches filled with random values: a step's cost does not depend on their contents). Also prints
the KV bytes the same rule gives the real Gemma-3 1B (26 layers, 22 local) at 4096 and 32768 positions.

    python benchmarks/sliding_ring.py [--rounds 3] [--before /work/main] [--reuse DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S, WINDOW = 4096, 512
POSITIONS = (100, 1000, 4000)

EXPORT = """import sys, json, time, torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig
import circle_fx
torch.manual_seed(0)
cfg = Gemma3TextConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=6,
                       num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=%d,
                       sliding_window_pattern=6, max_position_embeddings=%d)
model = Gemma3ForCausalLM(cfg).eval()
t = time.perf_counter()
pkg = circle_fx.export_llm(model, max_seq_len=%d, prefill_len=32, tokenizer=None)
pkg.save(sys.argv[1])
print(json.dumps({"export_s": time.perf_counter() - t, "size": pkg.model.size}))
""" % (WINDOW, S, S)

RUN = """import sys, time, json, statistics
import numpy as np
from circle_fx.llm.runner import LLMRunner
r = LLMRunner(sys.argv[1])
rng = np.random.default_rng(0)
for c in r.caches.values():
    c[...] = rng.standard_normal(c.shape, dtype=np.float32) * 0.1
r.step(5, 0)  # warm: the first call faults in every weight page
out = {}
for p in %r:
    ts = []
    for k in range(5):
        t = time.perf_counter(); r.step(5, p + k); ts.append(1e3 * (time.perf_counter() - t))
    out[p] = statistics.median(ts)
print(json.dumps(out))
""" % (POSITIONS,)


def kv_bytes(directory) -> int:
    m = json.load(open(os.path.join(directory, "manifest.json")))
    total = 0
    for shape in m["cache"]["shapes"].values():
        n = 4
        for d in shape:
            n *= d
        total += n
    return total


def gemma3_1b(max_seq_len: int) -> tuple[int, int]:
    """(before, after) KV bytes of Gemma-3 1B's geometry (26 layers, every 6th global, 1 KV head x 256)."""
    layers, per_row = 26, 2 * 1 * 256 * 4
    full = sum(1 for i in range(layers) if (i + 1) % 6 == 0)
    before = layers * max_seq_len * per_row
    after = (full * max_seq_len + (layers - full) * min(WINDOW - 1, max_seq_len)) * per_row
    return before, after


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", default="/work/main", help="the circle_fx tree without ring caches")
    ap.add_argument("--reuse", help="a directory with before/ and after/ packages from an earlier run")
    args = ap.parse_args()
    work = args.reuse or tempfile.mkdtemp(prefix="sliding_ring_")
    trees = {"before": os.path.abspath(args.before), "after": ROOT}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for name, tree in trees.items():
        d = os.path.join(work, name)
        if not os.path.isfile(os.path.join(d, "manifest.json")):
            out = subprocess.run([sys.executable, "-c", EXPORT, d], cwd=tree, env={**env, "PYTHONPATH": tree},
                                 capture_output=True, text=True, check=True).stdout
            print(name, "export", out.strip().splitlines()[-1], flush=True)
    for name in trees:
        print(f"{name}: KV {kv_bytes(os.path.join(work, name)) / 2**20:.2f} MiB", flush=True)
    times = {name: {p: [] for p in POSITIONS} for name in trees}
    for rnd in range(args.rounds):
        for name, tree in trees.items():
            out = subprocess.run([sys.executable, "-c", RUN, os.path.join(work, name)], cwd=tree,
                                 env={**env, "PYTHONPATH": tree}, capture_output=True, text=True, check=True).stdout
            for p, ms in json.loads(out.strip().splitlines()[-1]).items():
                times[name][int(p)].append(ms)
        print(f"round {rnd}: load {'/'.join(f'{x:.1f}' for x in os.getloadavg())}: "
              + "; ".join(f"{n} " + " ".join(f"@{p} {times[n][p][-1]:.2f}" for p in POSITIONS) for n in trees), flush=True)
    import statistics

    print("| package | KV MiB | " + " | ".join(f"decode @{p} ms" for p in POSITIONS) + " |")
    print("|---|---|" + "---|" * len(POSITIONS))
    for name in trees:
        print(f"| {name} | {kv_bytes(os.path.join(work, name)) / 2**20:.2f} | "
              + " | ".join(f"{statistics.median(times[name][p]):.2f}" for p in POSITIONS) + " |")
    ratios = {p: statistics.median(b / a for b, a in zip(times["before"][p], times["after"][p])) for p in POSITIONS}
    print("median per-round before/after:", {p: round(r, 2) for p, r in ratios.items()})
    for n in (4096, 32768):
        b, a = gemma3_1b(n)
        print(f"Gemma-3 1B geometry, max_seq_len {n}: KV {b / 2**20:.1f} MiB -> {a / 2**20:.1f} MiB ({b / a:.2f}x)")
    print("packages in", work)


if __name__ == "__main__":
    main()
