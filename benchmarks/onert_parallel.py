"""What onert 0.1.0 can run on two cores at one row (decode): executors, split linears, ggml threads.

    python benchmarks/onert_parallel.py                 # build the files (temp dir), 3 interleaved rounds
    python benchmarks/onert_parallel.py --rounds 5 --work DIR

The model: ``--layers`` stacked ``--n`` x ``--n`` linears (no bias), one row in, exported by
circle_fx in two forms: ``one`` (one FULLY_CONNECTED per linear) and ``split`` (each linear as two
FULLY_CONNECTEDs on the weight's row halves + CONCATENATION: two independent ops a dataflow
executor could run at once; ``merge_linears`` is removed from the pipeline, else it would merge
them back), each in float32, q8_0 and q4_0.

Configurations (one fresh child process each, interleaved per round, so background load hits
them alike): onert's ``EXECUTOR`` (Linear / Parallel), ``NUM_THREADS`` (also ggml's thread count),
and ``cpu;ruy`` backends with ``OP_BACKEND_MAP`` putting every first half-FC on ruy: onert's
ParallelExecutor has one worker thread *per backend* (ParallelScheduler; docs/onert-findings.md),
so two backends are the only way two of its ops can run at once.

Columns: wall ms per call (median), process CPU ms per call (the work done, whatever the load),
CPU/wall (1.0 = one busy core), relative error of the output vs numpy (float64 reference).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

# label -> (weights, form, backends, env)
CONFIGS = {
    "f32 one Linear": ("f32", "one", "cpu", {"EXECUTOR": "Linear", "NUM_THREADS": "1"}),
    "f32 split Linear": ("f32", "split", "cpu", {"EXECUTOR": "Linear", "NUM_THREADS": "1"}),
    "f32 split Parallel": ("f32", "split", "cpu", {"EXECUTOR": "Parallel", "NUM_THREADS": "1"}),
    "f32 split Parallel cpu+ruy": ("f32", "split", "cpu;ruy", {"EXECUTOR": "Parallel", "NUM_THREADS": "1",
                                                               "OP_BACKEND_MAP": "ruy-halves"}),
    "f32 one ruy": ("f32", "one", "ruy", {"EXECUTOR": "Linear", "NUM_THREADS": "1"}),
    "q8_0 one t1": ("q8_0", "one", "cpu", {"NUM_THREADS": "1"}),
    "q8_0 one t2": ("q8_0", "one", "cpu", {"NUM_THREADS": "2"}),
    "q8_0 split Parallel t1": ("q8_0", "split", "cpu", {"EXECUTOR": "Parallel", "NUM_THREADS": "1"}),
    "q4_0 one t1": ("q4_0", "one", "cpu", {"NUM_THREADS": "1"}),
    "q4_0 one t2": ("q4_0", "one", "cpu", {"NUM_THREADS": "2"}),
    "q4_0 split Linear t1": ("q4_0", "split", "cpu", {"EXECUTOR": "Linear", "NUM_THREADS": "1"}),
    "q4_0 split Parallel t1": ("q4_0", "split", "cpu", {"EXECUTOR": "Parallel", "NUM_THREADS": "1"}),
}


def build(work: str, n: int, layers: int) -> None:
    import numpy as np
    import torch

    import circle_fx

    class One(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layers = torch.nn.ModuleList(torch.nn.Linear(n, n, bias=False) for _ in range(layers))

        def forward(self, x):
            for lin in self.layers:
                x = lin(x)
            return x

    class Split(torch.nn.Module):
        def __init__(self, one):
            super().__init__()
            self.a = torch.nn.ModuleList(torch.nn.Linear(n, n // 2, bias=False) for _ in range(layers))
            self.b = torch.nn.ModuleList(torch.nn.Linear(n, n // 2, bias=False) for _ in range(layers))
            for lin, a, b in zip(one.layers, self.a, self.b):
                a.weight.data, b.weight.data = lin.weight.data[: n // 2].clone(), lin.weight.data[n // 2:].clone()

        def forward(self, x):
            for a, b in zip(self.a, self.b):
                x = torch.cat([a(x), b(x)], -1)
            return x

    one = One().eval()
    for lin in one.layers:  # keep the activations O(1) through the stack
        lin.weight.data *= 3 ** 0.5
    x = torch.randn(1, n, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = x.double()
        for lin in one.layers:
            ref = ref @ lin.weight.double().T
    np.save(os.path.join(work, "x.npy"), x.numpy())
    np.save(os.path.join(work, "ref.npy"), ref.numpy())
    no_merge = circle_fx.default_pipeline().remove_pass("merge_linears")
    for q in ("f32", "q8_0", "q4_0"):
        quant = None if q == "f32" else q
        circle_fx.export(one, (x,), quantize=quant).save(os.path.join(work, f"{q}_one.circle"))
        circle_fx.export(Split(one).eval(), (x,), quantize=quant, passes=no_merge).save(
            os.path.join(work, f"{q}_split.circle"))


def fc_indices(path: str) -> list[int]:
    """Operator indices of the FULLY_CONNECTEDs, in file order (OP_BACKEND_MAP keys)."""
    from circle_fx.circle.reader import read_circle

    return [op.index for op in read_circle(path).operators if op.name == "FULLY_CONNECTED"]


def child(path: str, backends: str, reps: int, work: str) -> None:
    import numpy as np
    import onert

    s = onert.infer.session(path, backends)
    x = np.load(os.path.join(work, "x.npy"))
    for _ in range(3):
        y = s.infer([x])
    walls, c0, w0 = [], time.process_time(), time.perf_counter()
    for _ in range(reps):
        t = time.perf_counter()
        y = s.infer([x])
        walls.append(time.perf_counter() - t)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    ref = np.load(os.path.join(work, "ref.npy"))
    err = float(np.abs(y[0] - ref).max() / np.abs(ref).max())
    print(json.dumps({"ms": statistics.median(walls) * 1e3, "cpu_ms": cpu / reps * 1e3, "cw": cpu / wall, "err": err}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work")
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--only", help="comma-separated config labels")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    work = args.work or tempfile.mkdtemp(prefix="onert_parallel_")
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), work)
        return 0
    if not os.path.exists(os.path.join(work, "q4_0_split.circle")):
        print(f"building in {work} ...", file=sys.stderr)
        build(work, args.n, args.layers)
    labels = args.only.split(",") if args.only else list(CONFIGS)
    load0 = os.getloadavg()
    res = {k: [] for k in labels}
    for r in range(args.rounds):
        for label in labels[r % len(labels):] + labels[: r % len(labels)]:
            wt, form, backends, env = CONFIGS[label]
            path = os.path.join(work, f"{wt}_{form}.circle")
            env = dict(os.environ, **env)
            if env.get("OP_BACKEND_MAP") == "ruy-halves":  # the first half-FC of each pair on ruy
                env["OP_BACKEND_MAP"] = ";".join(f"{i}=ruy" for i in fc_indices(path)[::2])
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--work", work, "--child", path,
                                backends, str(args.reps)], env=env, capture_output=True, text=True)
            if p.returncode:
                print(f"{label}: failed: {(p.stderr.strip().splitlines() or ['?'])[-1][:120]}", file=sys.stderr)
                continue
            res[label].append(json.loads(p.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"\n{args.layers} stacked {args.n}x{args.n} linears, one row; median over {args.rounds} interleaved "
          f"rounds of {args.reps} calls; load average {load0[0]:.2f} at the start, {os.getloadavg()[0]:.2f} "
          "at the end")
    print(f"{'configuration':<28}{'wall ms':>10}{'CPU ms':>10}{'CPU/wall':>10}{'rel. err':>10}")
    for label in labels:
        rows = res[label]
        if not rows:
            print(f"{label:<28}{'-':>10}")
            continue
        med = {k: statistics.median(x[k] for x in rows) for k in rows[0]}
        print(f"{label:<28}{med['ms']:>10.2f}{med['cpu_ms']:>10.2f}{med['cw']:>10.2f}{med['err']:>10.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
