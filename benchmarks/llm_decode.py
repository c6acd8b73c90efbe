"""Decode speed: circle_fx's KV-cache decode model in onert vs transformers eager with its KV cache.

    python benchmarks/llm_decode.py                  # export (to a temp dir), measure, trace, print the table
    python benchmarks/llm_decode.py --package DIR    # reuse a package exported before (same config!)

Model: the 125M Llama of ``convert_speed.py`` (vocab 32000, hidden 768, intermediate 2048,
12 layers, 12 heads, 4 KV heads), random weights (seed 0), float32, ``max_seq_len`` 640,
prefill_len 16.

Measured in one process, same machine, same run:

- **per-token time at positions 16, 128, 512**: onert: ``LLMRunner.step`` at that position
  (caches bound once, the new K/V rows written in place; the median of ``--reps`` calls);
  torch: one ``model(token, cache=DynamicCache with `pos` entries)`` forward, the cache
  cropped back after each call; median of ``--reps``.
- **tokens/s**: greedy generation of ``--new`` tokens after a 16-token prompt, decode steps
  only (prefill excluded), onert via ``LLMRunner.generate`` vs ``model.generate``-equivalent
  loop in torch (argmax, DynamicCache).
- **where the time goes**: a child process runs ``--trace-steps`` decode steps with onert's
  ``TRACING_MODE=1 WORKSPACE_DIR=<dir>`` and the per-op averages in ``trace.json`` are summed
  by op type.

Quantized weights: ``--quant MODE`` (repeatable: ``int8-weights``, ``q8_0``, ``q4_0``, ``q4_0-mix``)
also exports the same model with ``quantize=MODE`` and adds an ``onert MODE`` column and its
per-token time as a fraction of float32's (issue 17 asks q4_0 <= 1/3). The per-position times of all
onert packages are measured interleaved (one step of each package in turn, ``--reps`` rounds), so
a change of the machine's load hits every column alike. ``--int8`` is ``--quant int8-weights``;
``--int8-package DIR`` measures an int8 package exported before.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

POSITIONS = (16, 128, 512)
MAX_SEQ_LEN, PREFILL_LEN, PROMPT = 640, 16, 16


def build_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=4)
    return LlamaForCausalLM(cfg).eval()


def onert_times(packages: dict, reps: int, new: int) -> dict:
    """``{name: (per-position seconds, tokens/s, prefill seconds, greedy tokens)}``; the per-position
    steps interleaved across the packages (one step of each in turn, ``reps`` rounds)."""
    from circle_fx.llm.runner import LLMRunner

    runners = {name: LLMRunner(pkg) for name, pkg in packages.items()}
    ts = {name: {p: [] for p in POSITIONS} for name in runners}
    for p in POSITIONS:
        for r in runners.values():
            r.step(1, p)  # warm-up
        for _ in range(reps):
            for name, r in runners.items():
                t = time.perf_counter()
                r.step(1, p)
                ts[name][p].append(time.perf_counter() - t)
    out = {}
    for name, r in runners.items():
        per_pos = {p: statistics.median(ts[name][p]) for p in POSITIONS}
        prompt = list(range(3, 3 + PROMPT))
        t = time.perf_counter()
        r.run_prefill(prompt)
        prefill = time.perf_counter() - t
        steps = []
        orig = r.step

        def timed(token, position, orig=orig, steps=steps):
            t0 = time.perf_counter()
            res = orig(token, position)
            steps.append(time.perf_counter() - t0)
            return res

        r.step = timed
        tokens = r.generate(prompt, new, eos_token_ids=[])
        out[name] = (per_pos, len(steps) / sum(steps), prefill, tokens)
    return out


def torch_times(model, reps: int, new: int):
    import torch
    from transformers import DynamicCache

    per_pos = {}
    with torch.no_grad():
        for p in POSITIONS:
            cache = DynamicCache(config=model.config)
            model(torch.arange(3, 3 + p).view(1, p) % 32000, cache=cache, use_cache=True)
            tok = torch.tensor([[1]])
            pos = torch.tensor([[p]])
            ts = []
            for _ in range(reps + 1):
                t = time.perf_counter()
                model(tok, position_ids=pos, cache=cache, use_cache=True)
                ts.append(time.perf_counter() - t)
                cache.crop(-1)  # back to `p` entries
            per_pos[p] = statistics.median(ts[1:])
        prompt = torch.arange(3, 3 + PROMPT).view(1, PROMPT)
        cache = DynamicCache(config=model.config)
        out = model(prompt, cache=cache, use_cache=True)
        tokens = prompt[0].tolist()
        steps = []
        for k in range(new):
            token = int(out.logits[0, -1].argmax())
            tokens.append(token)
            if k == new - 1:
                break
            t = time.perf_counter()
            out = model(torch.tensor([[token]]), cache=cache, use_cache=True)
            steps.append(time.perf_counter() - t)
    return per_pos, len(steps) / sum(steps), tokens


TRACE_CHILD = r"""
import sys, numpy as np
sys.path.insert(0, {root!r})
from circle_fx.llm.runner import _Session
from circle_fx.llm import manifest as mf
m = mf.read({pkg!r})
s = _Session({pkg!r} + "/" + (m.get("file") or m["decode"]["file"]))  # version 2: model.circle
arrays, keep = [], []
if "entry" in m:  # one file: the entry flag (False: decode) and the prefill inputs bound too
    flag = np.zeros(1, np.bool_); keep.append(flag); s.bind(m["entry"]["index"], flag)
    for e in m["prefill"]["inputs"]:
        a = np.zeros(e["shape"], e["dtype"]); keep.append(a); s.bind(e["index"], a)
for e in m["decode"]["inputs"]:
    a = np.zeros(e["shape"], e["dtype"]); arrays.append(a); s.bind(e["index"], a)
pos = arrays[[e["name"] for e in m["decode"]["inputs"]].index("position")]
for k in range({steps}):
    pos[0] = 128 + k
    s.run()
"""


def trace(package: str, steps: int):
    work = tempfile.mkdtemp(prefix="llm_trace_")
    env = dict(os.environ, TRACING_MODE="1", WORKSPACE_DIR=work)
    subprocess.run([sys.executable, "-c", TRACE_CHILD.format(root=ROOT, pkg=package, steps=steps)], env=env,
                   check=True)
    with open(os.path.join(work, "trace.json")) as f:
        data = json.load(f)["Execution_Data"]["cpu"]
    by_op = defaultdict(lambda: [0.0, 0.0])  # op type -> [sum of per-op minimum, sum of per-op average] (us)
    for key, v in data.items():
        by_op[key.split()[-1]][0] += v["Min_Time"]
        by_op[key.split()[-1]][1] += v["Avg_Time"]
    return dict(by_op), work


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--package", help="an already exported package directory (default: export now)")
    ap.add_argument("--int8-package", help="an already exported package with int8 weights")
    ap.add_argument("--int8", action="store_true", help="same as --quant int8-weights")
    ap.add_argument("--quant", action="append", default=[], metavar="MODE",
                    help="also export and measure quantize=MODE (int8-weights, q8_0, q4_0, q4_0-mix); repeatable")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--new", type=int, default=32, help="new tokens for the tokens/s measurement")
    ap.add_argument("--trace-steps", type=int, default=20)
    ap.add_argument("--keep", action="store_true", help="keep the package this run exported (printed on stderr)")
    args = ap.parse_args(argv)

    import torch

    import circle_fx

    model = build_model()
    package, made = args.package, args.package is None
    if made:
        package = tempfile.mkdtemp(prefix="llm_decode_")
        t = time.perf_counter()
        circle_fx.export_llm(model, max_seq_len=MAX_SEQ_LEN, prefill_len=PREFILL_LEN).save(package)
        print(f"exported to {package} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    modes = list(dict.fromkeys((["int8-weights"] if args.int8 or args.int8_package else []) + args.quant))
    packages, exported = {"f32": package}, []
    for mode in modes:
        if mode == "int8-weights" and args.int8_package:
            packages[mode] = args.int8_package
            continue
        packages[mode] = tempfile.mkdtemp(prefix=f"llm_decode_{mode}_")
        exported.append(packages[mode])
        t = time.perf_counter()
        circle_fx.export_llm(model, max_seq_len=MAX_SEQ_LEN, prefill_len=PREFILL_LEN, quantize=mode).save(packages[mode])
        print(f"exported {mode} to {packages[mode]} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    measured = onert_times(packages, args.reps, args.new)
    on_pos, on_tps, on_prefill, on_tokens = measured["f32"]
    threads = torch.get_num_threads()
    th_pos, th_tps, th_tokens = torch_times(model, args.reps, args.new)
    torch.set_num_threads(1)  # onert's CPU backend runs these ops on one thread: the like-for-like baseline
    t1_pos, t1_tps, _ = torch_times(model, args.reps, args.new)
    torch.set_num_threads(threads)
    by_op, work = trace(package, args.trace_steps)
    if not args.keep:
        for d in ([package] if made else []) + exported:
            shutil.rmtree(d, ignore_errors=True)  # two ~480 MB files (float32)

    cols = ["onert f32", *(f"onert {m}" for m in modes), f"torch {threads}thr", "torch 1thr", f"f32/torch{threads}",
            "f32/torch1", *(f"{m}/f32" for m in modes)]
    w = max(13, *(len(c) + 2 for c in cols))
    print(f"\nDecode, 125M Llama (12 layers, hidden 768, 4 KV heads, vocab 32000), max_seq_len {MAX_SEQ_LEN}; "
          f"onert packages interleaved (each runner's own NUM_THREADS advice); torch eager with DynamicCache")
    print(f"{'':28}" + "".join(f"{c:>{w}}" for c in cols))
    print("-" * (28 + w * len(cols)))
    for p in POSITIONS:
        row = [f"{on_pos[p] * 1e3:.1f} ms", *(f"{measured[m][0][p] * 1e3:.1f} ms" for m in modes),
               f"{th_pos[p] * 1e3:.1f} ms", f"{t1_pos[p] * 1e3:.1f} ms", f"{on_pos[p] / th_pos[p]:.2f}x",
               f"{on_pos[p] / t1_pos[p]:.2f}x", *(f"{measured[m][0][p] / on_pos[p]:.2f}x" for m in modes)]
        print(f"{f'per token @ position {p}':28}" + "".join(f"{c:>{w}}" for c in row))
    row = [f"{on_tps:.1f}", *(f"{measured[m][1]:.1f}" for m in modes), f"{th_tps:.1f}", f"{t1_tps:.1f}",
           f"{on_tps / th_tps:.2f}x", f"{on_tps / t1_tps:.2f}x", *(f"{on_tps / measured[m][1]:.2f}x" for m in modes)]
    print(f"{f'tokens/s ({args.new} new, greedy)':28}" + "".join(f"{c:>{w}}" for c in row))
    print("(per-token rows: time ratio onert/torch, < 1 = onert faster; tokens/s row: speed ratio, > 1 = onert faster;\n"
          " MODE/f32: that mode's time as a fraction of float32's, in both rows)")
    for m in modes:
        print(f"onert prefill of {PROMPT} tokens, {m}: {measured[m][2] * 1e3:.1f} ms; same greedy tokens as f32: "
              f"{measured[m][3] == on_tokens}")
    flat = max(on_pos.values()) / min(on_pos.values())
    print(f"\nonert per-token time, position 512 vs 16: {on_pos[512] / on_pos[16]:.2f}x (max/min {flat:.2f}x)")
    print(f"same greedy tokens onert vs torch: {on_tokens == th_tokens}")
    print(f"onert prefill of {PROMPT} tokens (prefill_len {PREFILL_LEN}): {on_prefill * 1e3:.1f} ms")
    tmin, tavg = sum(v[0] for v in by_op.values()), sum(v[1] for v in by_op.values())
    print(f"\nwhere the onert decode time goes (TRACING_MODE=1, {args.trace_steps} steps near position 128; per op "
          f"the minimum and the average over the steps, summed by op type; trace in {work}):")
    print(f"  {'op':<18} {'sum of min':>12} {'share':>7} {'sum of avg':>12}")
    for op, (mn, avg) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:8]:
        print(f"  {op:<18} {mn / 1e3:9.2f} ms {100 * mn / tmin:6.1f} % {avg / 1e3:9.2f} ms")
    print(f"  {'total':<18} {tmin / 1e3:9.2f} ms {'':>7} {tavg / 1e3:9.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
