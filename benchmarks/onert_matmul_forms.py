"""Which op form onert 0.1.0 runs a constant-weight linear fastest in: a probe table.

For each (in, out) size and row count S it builds three one-linear Circle files, all
taking ``x [1, S, in]`` and returning ``[S, out]`` (or ``[1, S, out]``) so the wrapping
RESHAPEs are part of the price, exactly as circle_fx emits them:

- ``FC``:   FULLY_CONNECTED(x, W[out,in], bias -1)
- ``CONV``: RESHAPE [1,S,1,in] -> CONV_2D(filter W as [out,1,1,in], zero bias) -> RESHAPE
- ``BMM``:  BATCH_MATMUL(x, W^T [in,out])

and times them interleaved (FC, CONV, BMM, FC, ...): median of ``--runs``, and the ratio
of the minima (the best case on a shared machine: closest to an idle one). The table it
prints is what ``docs/onert-findings.md`` records and what ``circle_fx/emit/
linear_form.py`` encodes as constants.

    python benchmarks/onert_matmul_forms.py              # the default sweep (~3 min)
    python benchmarks/onert_matmul_forms.py --rows 1,128 --sizes 768x768
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from circle_fx.emit.builder import BO, ModelBuilder  # noqa: E402
from circle_fx.emit.lowerings._common import options  # noqa: E402
from circle_fx.circle.schema import NUMPY_TO_CIRCLE  # noqa: E402
from circle_fx.emit.writer import serialize  # noqa: E402

F32 = NUMPY_TO_CIRCLE[np.dtype(np.float32)]


def build(form: str, S: int, cin: int, cout: int, w: np.ndarray) -> bytes:
    mb = ModelBuilder()
    x = mb.add_tensor("x", [1, S, cin], F32)
    mb.inputs, mb.input_names = [x], ["x"]
    if form == "FC":
        y = mb.add_tensor("y", [S, cout], F32)
        mb.add_operator(BO.FULLY_CONNECTED, [x, mb.add_constant("w", w), -1], [y],
                        options("FullyConnectedOptions", keepNumDims=False))
    elif form == "CONV":
        x4 = mb.add_tensor("x4", [1, S, 1, cin], F32)
        mb.add_operator(BO.RESHAPE, [x, mb.add_constant("s1", np.array([1, S, 1, cin], np.int32))], [x4])
        y4 = mb.add_tensor("y4", [1, S, 1, cout], F32)
        mb.add_operator(BO.CONV_2D, [x4, mb.add_constant("f", w.reshape(cout, 1, 1, cin)),
                                     mb.add_constant("b", np.zeros(cout, np.float32))], [y4],
                        options("Conv2DOptions", padding=1, strideW=1, strideH=1,
                                dilationWFactor=1, dilationHFactor=1))
        y = mb.add_tensor("y", [1, S, cout], F32)
        mb.add_operator(BO.RESHAPE, [y4, mb.add_constant("s2", np.array([1, S, cout], np.int32))], [y])
    elif form == "BMM":
        y = mb.add_tensor("y", [1, S, cout], F32)
        mb.add_operator(BO.BATCH_MATMUL, [x, mb.add_constant("wt", np.ascontiguousarray(w.T))], [y],
                        options("BatchMatMulOptions"))
    else:
        raise ValueError(form)
    mb.outputs, mb.output_names = [y], ["y"]
    return serialize(mb).to_bytes()


def measure(S: int, cin: int, cout: int, runs: int, forms=("FC", "CONV", "BMM")) -> dict:
    import onert

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((cout, cin)) / np.sqrt(cin)).astype(np.float32)
    x = rng.standard_normal((1, S, cin)).astype(np.float32)
    ref = x.reshape(S, cin) @ w.T
    sessions, times, cpu, errs = {}, {f: [] for f in forms}, {f: 0.0 for f in forms}, {}
    with tempfile.TemporaryDirectory() as d:
        for f in forms:
            p = os.path.join(d, f"{f}.circle")
            with open(p, "wb") as fh:
                fh.write(build(f, S, cin, cout, w))
            sessions[f] = onert.infer.session(p)
            out = sessions[f].infer([x])[0]
            errs[f] = float(np.abs(out.reshape(S, cout) - ref).max())
            sessions[f].infer([x])
        for _ in range(runs):
            for f in forms:
                t, c = time.perf_counter(), time.process_time()
                sessions[f].infer([x])
                times[f].append(time.perf_counter() - t)
                cpu[f] += time.process_time() - c
    return {f: (statistics.median(times[f]), errs[f], cpu[f] / sum(times[f]), min(times[f])) for f in forms}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,4,8,16,32,64,128")
    ap.add_argument("--sizes", default="768x768,768x1280,768x2048,2048x768,768x4096,768x32000",
                    help="comma-separated INxOUT")
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args(argv)
    os.environ.setdefault("USE_MMAPED_DATA", "1")
    rows = [int(s) for s in args.rows.split(",")]
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    print(f"onert CPU backend, {os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f}), median of {args.runs} "
          "interleaved runs; ms per call (ratio to FC); max|err| vs numpy; process CPU time / wall time")
    print(f"{'in x out':>12}{'S':>5}{'FC ms':>9}{'CONV ms':>9}{'BMM ms':>9}{'CONV/FC':>9}{'BMM/FC':>8}  best  max|err|"
          "  cpu/wall FC CONV  min-ratio CONV/FC BMM/FC")
    for cin, cout in sizes:
        for S in rows:
            runs = args.runs if cout * cin * S < 768 * 32000 * 64 else max(3, args.runs // 2)
            r = measure(S, cin, cout, runs)
            fc, conv, bmm = (r[f][0] * 1e3 for f in ("FC", "CONV", "BMM"))
            best = min(r, key=lambda f: r[f][0])
            err = max(e for _, e, _, _ in r.values())
            print(f"{cin:>5} x {cout:<5}{S:>5}{fc:>9.2f}{conv:>9.2f}{bmm:>9.2f}{conv / fc:>9.2f}{bmm / fc:>8.2f}"
                  f"  {best:<5} {err:.1e}  {r['FC'][2]:>8.2f} {r['CONV'][2]:.2f}"
                  f"  {r['CONV'][3] / r['FC'][3]:>13.2f} {r['BMM'][3] / r['FC'][3]:>6.2f}", flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
