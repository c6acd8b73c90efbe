"""onert run-time speed of the emitted 125M Llama: today's form vs the new one, and torch eager.

    python benchmarks/onert_speed.py                # 125M config, 1x128 ids, 10 timed runs each
    python benchmarks/onert_speed.py --runs 20 --layers 12 --seq 128

Two Circle files from the same model (``benchmarks/convert_speed.py``'s config, random
weights, seed 0):

- ``today``: the pipeline without ``merge_linears`` and ``fold_views``, every linear forced to
  FULLY_CONNECTED, the emitter's peephole off: what circle_fx emitted before issue 12;
- ``new``:   the default pipeline and emitter.

One child process exports both (and the eager logits); one child loads both in onert and
times them interleaved (today, new, today, ...), median and min; one child per file re-runs
it with onert's tracer (``TRACING_MODE=1``, ``WORKSPACE_DIR``: onert writes
``trace.table.md`` with one table per run, op latencies in us) to split the time by op type
(median over runs, the first run dropped); one child times torch eager at 1 and 2 threads,
interleaved. The table printed is what benchmarks/README.md shows.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TARGET = 0.7  # issue 12: new <= 0.7x today's latency


def build(layers: int, seq: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from convert_speed import VOCAB

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=768, intermediate_size=2048, num_hidden_layers=layers,
                      num_attention_heads=12, num_key_value_heads=4, use_cache=False)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, VOCAB, (1, seq), generator=torch.Generator().manual_seed(1))
    return model, ids


def today_pipeline(fold: bool = False):
    """The pipeline and emitter choices circle_fx had before issue 12 (``fold``: plus the
    reshape/transpose folding, for the op count alone)."""
    import torch

    import circle_fx
    from circle_fx.emit import linear_form
    from circle_fx.emit.legalize.peephole import META_KEY

    def fully_connected_only(program) -> bool:
        program.gm.meta[META_KEY] = fold
        for n in program.graph.nodes:
            if n.op == "call_function" and n.target is torch.ops.aten.linear.default:
                n.meta[linear_form.META_KEY] = linear_form.FULLY_CONNECTED
        return False

    pipe = circle_fx.default_pipeline().remove_pass("merge_linears")
    if not fold:
        pipe.remove_pass("fold_views")
    pipe.append(fully_connected_only)
    return pipe


# ------------------------------------------------------------------------ children
def child_export(args) -> dict:
    import numpy as np
    import torch

    import circle_fx

    model, ids = build(args.layers, args.seq)
    with torch.no_grad():
        np.save(os.path.join(args.dir, "ref.npy"), model(ids).logits.numpy())
    np.save(os.path.join(args.dir, "ids.npy"), ids.numpy())
    out = {}
    for name, passes in (("today", today_pipeline()), ("new", None), ("fold_only", today_pipeline(fold=True))):
        t = time.perf_counter()
        cm = circle_fx.export(model, (ids,), passes=passes)
        if name != "fold_only":
            cm.save(os.path.join(args.dir, f"{name}.circle"))
        out[name] = {"ops": dict(cm.op_histogram()), "export_s": time.perf_counter() - t}
        del cm
    return out


def child_onert(args) -> dict:
    import numpy as np
    import onert

    ids = np.load(os.path.join(args.dir, "ids.npy"))
    ref = np.load(os.path.join(args.dir, "ref.npy"))
    sessions, times, diff = {}, defaultdict(list), {}
    for name in ("today", "new"):
        sessions[name] = onert.infer.session(os.path.join(args.dir, f"{name}.circle"))
        out = sessions[name].infer([ids])[0]
        diff[name] = float(np.abs(out.reshape(ref.shape) - ref).max())
    for _ in range(args.runs):
        for name, s in sessions.items():
            t = time.perf_counter()
            s.infer([ids])
            times[name].append(time.perf_counter() - t)
    return {name: {"median": statistics.median(v), "min": min(v), "max_abs_diff": diff[name]}
            for name, v in times.items()}


def child_trace(args) -> dict:
    """Runs one file under onert's tracer; returns {op type: median us per run}."""
    import numpy as np
    import onert

    ids = np.load(os.path.join(args.dir, "ids.npy"))
    s = onert.infer.session(os.path.join(args.dir, f"{args.name}.circle"))
    for _ in range(args.trace_runs + 1):
        s.infer([ids])
    del s  # the tracer writes its files when the session closes
    return {"per_op": parse_trace(os.environ["WORKSPACE_DIR"])}


def parse_trace(workspace: str) -> dict:
    """``trace.table.md``: one '# Session: .. Running count: k' table per run, rows
    '| $0 subgraph @i OpType | cpu | latency(us) | ...'. Median over runs (run 0 dropped) of
    the per-run sum by op type."""
    with open(os.path.join(workspace, "trace.table.md")) as f:
        text = f.read()
    runs = []
    for block in re.split(r"^# Session:", text, flags=re.M)[1:]:
        per = defaultdict(float)
        for m in re.finditer(r"^\| \$\d+ subgraph @\d+ (\w+) \| \w+ \| (\d+) \|", block, flags=re.M):
            per[m.group(1)] += int(m.group(2))
        runs.append(per)
    runs = runs[1:] or runs
    types = {k for r in runs for k in r}
    return {k: statistics.median(r.get(k, 0.0) for r in runs) for k in types}


def child_torch(args) -> dict:
    import torch

    model, ids = build(args.layers, args.seq)
    times = defaultdict(list)
    with torch.no_grad():
        for threads in (1, 2):
            torch.set_num_threads(threads)
            model(ids)
        for _ in range(args.runs):
            for threads in (1, 2):
                torch.set_num_threads(threads)
                t = time.perf_counter()
                model(ids)
                times[threads].append(time.perf_counter() - t)
    return {str(k): {"median": statistics.median(v), "min": min(v)} for k, v in times.items()}


CHILDREN = {"export": child_export, "onert": child_onert, "trace": child_trace, "torch": child_torch}


def run_child(mode: str, args, env_extra: dict | None = None, **extra) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--dir", args.dir, "--layers", str(args.layers),
           "--seq", str(args.seq), "--runs", str(args.runs), "--trace-runs", str(args.trace_runs)]
    for k, v in extra.items():
        cmd += [f"--{k}", str(v)]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               USE_MMAPED_DATA="1", PYTHONWARNINGS="ignore", **(env_extra or {}))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
    raise SystemExit(f"{mode} child exited with {proc.returncode}:\n{tail}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--runs", type=int, default=10, help="timed runs per form (interleaved), median reported")
    ap.add_argument("--trace-runs", type=int, default=3, help="traced runs per file (after one warm-up)")
    ap.add_argument("--child", choices=list(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    ap.add_argument("--name", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(CHILDREN[args.child](args)), flush=True)
        return 0

    sys.stdout.reconfigure(line_buffering=True)
    with tempfile.TemporaryDirectory(prefix="onert_speed_") as d:
        args.dir = d
        load0 = os.getloadavg()[0]
        print(f"Llama {args.layers} layers, hidden 768, intermediate 2048, 12 heads / 4 KV heads, vocab 32000, "
              f"ids 1x{args.seq}, random weights; {os.cpu_count()} CPUs, load average {load0:.1f} at start\n")
        ex = run_child("export", args)
        on = run_child("onert", args)
        traces = {}
        for name in ("today", "new"):
            ws = os.path.join(d, f"trace_{name}")
            os.makedirs(ws)
            traces[name] = run_child("trace", args, {"TRACING_MODE": "1", "WORKSPACE_DIR": ws}, name=name)["per_op"]
        tq = run_child("torch", args)
        load1 = os.getloadavg()[0]

    today, new = on["today"], on["new"]
    print(f"{'':<30}{'today':>12}{'new':>12}{'new/today':>11}")
    print("-" * 65)
    print(f"{'onert latency, median':<30}{today['median'] * 1e3:>9.1f} ms{new['median'] * 1e3:>9.1f} ms"
          f"{new['median'] / today['median']:>11.3f}")
    print(f"{'onert latency, min':<30}{today['min'] * 1e3:>9.1f} ms{new['min'] * 1e3:>9.1f} ms"
          f"{new['min'] / today['min']:>11.3f}")
    ops_t, ops_n = sum(ex["today"]["ops"].values()), sum(ex["new"]["ops"].values())
    print(f"{'operators':<30}{ops_t:>12}{ops_n:>12}{ops_n / ops_t:>11.3f}")
    ops_f = sum(ex["fold_only"]["ops"].values())
    print(f"{'  today + folding only':<30}{ops_t:>12}{ops_f:>12}{ops_f / ops_t:>11.3f}   "
          f"(RESHAPE {ex['today']['ops'].get('RESHAPE', 0)} -> {ex['fold_only']['ops'].get('RESHAPE', 0)}, "
          f"TRANSPOSE {ex['today']['ops'].get('TRANSPOSE', 0)} -> {ex['fold_only']['ops'].get('TRANSPOSE', 0)})")
    print(f"{'max|logits - eager|':<30}{today['max_abs_diff']:>12.1e}{new['max_abs_diff']:>12.1e}")
    et, en = ex["today"]["export_s"], ex["new"]["export_s"]
    print(f"{'export + save time':<30}{et:>10.2f} s{en:>10.2f} s{en / et:>11.3f}")
    print(f"\nper op type (onert trace, median of {args.trace_runs} traced runs; the tracer slows multithreaded "
          "kernels, compare shares):")
    print(f"  {'op':<18}{'today ms':>10}{'share':>8}{'count':>7}{'new ms':>10}{'share':>8}{'count':>7}")
    tot_t, tot_n = sum(traces["today"].values()), sum(traces["new"].values())
    names = {"FullyConnected": "FULLY_CONNECTED", "Conv2D": "CONV_2D", "BatchMatMul": "BATCH_MATMUL",
             "Concat": "CONCATENATION"}
    for op in sorted(set(traces["today"]) | set(traces["new"]),
                     key=lambda k: -max(traces["today"].get(k, 0), traces["new"].get(k, 0))):
        circle_name = names.get(op, re.sub(r"(?<!^)(?=[A-Z])", "_", op).upper())
        a, b = traces["today"].get(op, 0.0), traces["new"].get(op, 0.0)
        ca, cb = ex["today"]["ops"].get(circle_name, ""), ex["new"]["ops"].get(circle_name, "")
        print(f"  {op:<18}{a / 1e3:>10.1f}{a / tot_t:>8.1%}{ca!s:>7}{b / 1e3:>10.1f}{b / tot_n:>8.1%}{cb!s:>7}")
    print(f"  {'total':<18}{tot_t / 1e3:>10.1f}{'':>15}{tot_n / 1e3:>10.1f}")
    print("\ntorch eager (same model and ids, no_grad), interleaved:")
    for th in ("1", "2"):
        r = tq[th]
        print(f"  {th} thread{'s' if th != '1' else ' '}: median {r['median'] * 1e3:7.1f} ms (min {r['min'] * 1e3:.1f}); "
              f"onert new / torch = {new['median'] / r['median']:.2f}x")
    print(f"\nload average {load0:.1f} at start, {load1:.1f} at end (the machine is shared; compare within a run)")
    ratio = new["median"] / today["median"]
    ok = ratio <= TARGET
    print(f"\ntarget: [{'ok' if ok else 'MISS'}] onert new/today {ratio:.3f} <= {TARGET}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
