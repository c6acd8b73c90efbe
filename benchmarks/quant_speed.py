"""float32 vs int8-weights on the 125M Llama of ``convert_speed.py``: one table.

    python benchmarks/quant_speed.py [--runs 10] [--token-runs 50] [--out-dir DIR]

Rows: file size; conversion time and peak RSS (``circle_fx.export`` + ``save``, 1x128 ids);
onert prefill latency (1x128 ids) and single-token latency (a model exported for 1x1 ids:
one token's forward, no KV cache), each the median of interleaved runs (float, int8, float,
...) so background load hits both alike; onert peak RSS (load + one prefill run, its own
process); logits error against eager PyTorch on the 1x128 input (relative L2, max abs,
top-1 agreement over the 128 positions).

Every measurement runs in its own subprocess; peak RSS is that process's VmHWM.
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

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = {"float32": None, "int8-weights": "int8-weights"}


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def child_convert(mode: str, seq: int, out: str) -> dict:
    import numpy as np
    import torch

    import circle_fx
    from convert_speed import build_model

    model, ids = build_model(12)
    ids = ids[:, :seq]
    t0 = time.perf_counter()
    cm = circle_fx.export(model, (ids,), quantize=MODES[mode], verbose=False)
    cm.save(out)
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        np.save(out + ".ref.npy", model(ids).logits.numpy())
    np.save(out + ".ids.npy", ids.numpy())
    return {"seconds": seconds, "rss": peak_rss(), "size": os.path.getsize(out),
            "by_dtype": cm.weight_bytes_by_dtype(), "rms_norm": cm.op_histogram()["RMS_NORM"]}


def child_latency(paths: str, runs: int) -> dict:
    """Interleaved medians for the ``os.pathsep``-separated models, plus their logits errors."""
    import numpy as np
    import onert

    out = {}
    sessions = {}
    for p in paths.split(os.pathsep):
        ids = np.load(p + ".ids.npy")
        sess = onert.infer.session(p)
        got = sess.infer([ids])[0]  # warm-up, and the numbers
        ref = np.load(p + ".ref.npy")
        out[p] = {"rel": float(np.linalg.norm(got - ref) / np.linalg.norm(ref)),
                  "max_abs": float(np.abs(got - ref).max()),
                  "top1": float((got.argmax(-1) == ref.argmax(-1)).mean()), "times": []}
        sessions[p] = (sess, ids)
    for _ in range(runs):
        for p, (sess, ids) in sessions.items():
            t = time.perf_counter()
            sess.infer([ids])
            out[p]["times"].append(time.perf_counter() - t)
    for p in out:
        out[p]["median"] = statistics.median(out[p]["times"])
    return out


def child_onert_rss(path: str) -> dict:
    import numpy as np
    import onert

    sess = onert.infer.session(path)
    sess.infer([np.load(path + ".ids.npy")])
    return {"rss": peak_rss()}


CHILDREN = {"convert": child_convert, "latency": child_latency, "onert_rss": child_onert_rss}


def run_child(*args) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(args)], capture_output=True,
                          text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"child {args[0]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="interleaved prefill runs per model")
    ap.add_argument("--token-runs", type=int, default=50, help="interleaved single-token runs per model")
    ap.add_argument("--out-dir", default=None, help="keep the .circle files here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        name, *rest = json.loads(args.child)
        print(json.dumps(CHILDREN[name](*rest)))
        return 0
    out_dir = args.out_dir or tempfile.mkdtemp(prefix="quant_speed_")
    os.makedirs(out_dir, exist_ok=True)
    try:
        path = {(m, s): os.path.join(out_dir, f"llama125m_{m}_s{s}.circle") for m in MODES for s in (128, 1)}
        conv = {}
        for (m, s), p in path.items():
            print(f"converting {m} 1x{s} ...", file=sys.stderr, flush=True)
            conv[m, s] = run_child("convert", m, s, p)
        print("onert ...", file=sys.stderr, flush=True)
        pre = run_child("latency", os.pathsep.join(path[m, 128] for m in MODES), args.runs)
        tok = run_child("latency", os.pathsep.join(path[m, 1] for m in MODES), args.token_runs)
        rss = {m: run_child("onert_rss", path[m, 128]) for m in MODES}
        mib = 1 << 20
        rows = [
            ("file size (MiB)", lambda m: conv[m, 128]["size"] / mib, "{:.1f}"),
            ("conversion time, 1x128 (s)", lambda m: conv[m, 128]["seconds"], "{:.2f}"),
            ("conversion peak RSS (MiB)", lambda m: conv[m, 128]["rss"] / mib, "{:.0f}"),
            ("onert prefill 1x128, median (ms)", lambda m: 1e3 * pre[path[m, 128]]["median"], "{:.1f}"),
            ("onert 1-token forward, median (ms)", lambda m: 1e3 * tok[path[m, 1]]["median"], "{:.2f}"),
            ("onert peak RSS, load + prefill (MiB)", lambda m: rss[m]["rss"] / mib, "{:.0f}"),
            ("logits rel. L2 error vs eager, 1x128", lambda m: pre[path[m, 128]]["rel"], "{:.2e}"),
            ("logits max abs error vs eager, 1x128", lambda m: pre[path[m, 128]]["max_abs"], "{:.2e}"),
            ("top-1 agreement, 128 positions", lambda m: pre[path[m, 128]]["top1"], "{:.3f}"),
            ("1-token logits rel. L2 error", lambda m: tok[path[m, 1]]["rel"], "{:.2e}"),
        ]
        f, q = MODES
        print(f"\n125M Llama (vocab 32000, hidden 768, 12 layers), onert 0.1.0 CPU; "
              f"{args.runs} prefill / {args.token_runs} token runs, interleaved\n")
        print(f"| {'':<38} | {f:>12} | {q:>12} | {'int8/float':>10} |")
        print(f"|{'-' * 40}|{'-' * 14}|{'-' * 14}|{'-' * 12}|")
        for label, get, fmt in rows:
            a, b = get(f), get(q)
            ratio = f"{b / a:.2f}x" if a and "error" not in label and "agreement" not in label else ""
            print(f"| {label:<38} | {fmt.format(a):>12} | {fmt.format(b):>12} | {ratio:>10} |")
        print(f"\nint8 file by dtype: {conv[q, 128]['by_dtype']}; RMS_NORM fused: "
              f"{conv[q, 128]['rms_norm']} (float: {conv[f, 128]['rms_norm']})")
    finally:
        if args.out_dir is None:
            shutil.rmtree(out_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
