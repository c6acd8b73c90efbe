"""Which form of one linear onert 0.1.0 runs fastest, per weight encoding and row count: a probe table.

    python benchmarks/onert_prefill_forms.py                      # the benchmark Llama's shapes, rows 1,16,128
    python benchmarks/onert_prefill_forms.py --rows 128 --shapes 768x4096 --runs 5

Every form takes ``x [S, in]`` float32 and returns ``[S, out]`` float32 (the RESHAPEs a form
needs are part of its price, as circle_fx emits them). Forms (``--forms``):

- ``f32 FC``       FULLY_CONNECTED(x, W float32)
- ``f32 CONV``     RESHAPE [1,S,1,in] -> CONV_2D(filter W as [out,1,1,in], zero bias) -> RESHAPE
- ``f32 CONV-W``   the same with the rows along W: input [1,1,S,in] (another NHWC arrangement)
- ``f32 BMM``      BATCH_MATMUL(x, W transposed at build time to a constant [in, out])
- ``int8 FC``      hybrid FULLY_CONNECTED(x, W int8, per-tensor scale 1) -> MUL by the row scales
                   (what ``quantize="int8-weights"`` emits for static rows)
- ``int8 DQ-FC``   DEQUANTIZE(W int8) -> float FULLY_CONNECTED -> MUL (its dynamic-rows form)
- ``int8 HCONV``   hybrid CONV_2D: float input, per-channel int8 filter [out,1,1,in] (scales on
                   axis 0), zero float bias, no MUL (what int8-weights emits for convolutions)
- ``int8 DQ-CONV`` DEQUANTIZE(W int8 [out,1,1,in]) -> CONV_2D -> MUL: the int8 bytes stay in the
                   file, the multithreaded float kernel does the product (the weight is dequantized
                   on every call)
- ``q8_0 FC`` / ``q4_0 FC``  FULLY_CONNECTED with a GGML_Q8_0 / GGML_Q4_0 weight (ggml's kernel)
- ``q4_0 DQ-CONV`` GATHER of every row of the GGML_Q4_0 weight (onert's Q4_0 GATHER dequantizes
                   exactly; there is no GGML DEQUANTIZE) -> RESHAPE [out,1,1,in] -> CONV_2D

A form name ending in ``@ruy`` runs the same file on onert's ruy backend: a session with
``backends="cpu;ruy"`` prepared with ``OP_BACKEND_FullyConnected=ruy OP_BACKEND_Conv2D=ruy`` (ruy
has only those two kernels; ``backends="ruy;cpu"`` puts *every* op on ruy and fails to prepare on
the RESHAPEs, "NYI for operation 'Reshape'").

Each form runs in a session prepared with ``NUM_THREADS=1`` (``t1``) and with ``NUM_THREADS=2``
(``t2``): onert reads the variable when it prepares a session, and it sets both the CONV_2D
threads of the ruy backend and ggml's threads (docs/onert-findings.md). It does **not** size the
cpu backend's float CONV_2D: that runs Eigen's contraction on one process-wide thread pool of
one thread per core, whatever ``NUM_THREADS`` says, so its ``t1`` and ``t2`` rows are the same
kernel on two threads. One child process per (shape, rows)
holds all the sessions and calls them interleaved (form by form, ``--runs`` rounds), so load hits
all forms alike; the table shows the median wall ms per call and the process CPU ms per call (all threads: on a
loaded machine the comparable number for one-thread forms), the best form marked ``*`` per bits per
weight (32: f32; 8: int8 and q8_0; 4: q4_0). The last table sums the 125M benchmark Llama's
linears at each row count (12 layers of q/k/v merged 768x1280, o 768x768, gate/up merged
768x4096, down 2048x768; the LM head is 1 row in prefill, at ``last_index``) per form and thread
setting, best form per shape: what a per-linear choice would cost. The machine's load average is
printed with every table: compare numbers of one run only.
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

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

FORMS = ("f32 FC", "f32 CONV", "f32 CONV-W", "f32 BMM", "f32 FC@ruy", "f32 CONV@ruy", "int8 FC", "int8 DQ-FC",
         "int8 HCONV", "int8 DQ-CONV", "q8_0 FC", "q4_0 FC", "q4_0 DQ-CONV")
BITS = {"f32": 32, "int8": 8, "q8_0": 8, "q4_0": 4}
#: the benchmark Llama's linears (in x out) and how many of each one prefill runs
LLAMA = {(768, 1280): 12, (768, 768): 12, (768, 4096): 12, (2048, 768): 12}


def build(form: str, S: int, cin: int, cout: int, w: np.ndarray) -> bytes:
    import torch

    from circle_fx.circle import ggml
    from circle_fx.circle.schema import NUMPY_TO_CIRCLE, QuantParams
    from circle_fx.emit.builder import BO, ModelBuilder
    from circle_fx.emit.lowerings._common import options
    from circle_fx.emit.writer import serialize
    from circle_fx.quant.ggml import pack
    from circle_fx.quant.weight_only import quantize_rows

    F32, I8 = NUMPY_TO_CIRCLE[np.dtype(np.float32)], NUMPY_TO_CIRCLE[np.dtype(np.int8)]
    mb = ModelBuilder()
    x = mb.add_tensor("x", [S, cin], F32)
    mb.inputs, mb.input_names = [x], ["x"]
    y = mb.add_tensor("y", [S, cout], F32)
    mb.outputs, mb.output_names = [y], ["y"]
    kind, shape = form.split("@")[0].split(" ")
    fc_opts = options("FullyConnectedOptions", keepNumDims=False)

    def conv(filt, out, h_rows=True):
        nhwc = [1, S, 1, cin] if h_rows else [1, 1, S, cin]
        x4 = mb.add_tensor("x4", nhwc, F32)
        mb.add_operator(BO.RESHAPE, [x, mb.add_constant("s1", np.array(nhwc, np.int32))], [x4])
        y4 = mb.add_tensor("y4", nhwc[:3] + [cout], F32)
        mb.add_operator(BO.CONV_2D, [x4, filt, mb.add_constant("b", np.zeros(cout, np.float32))], [y4],
                        options("Conv2DOptions", padding=1, strideW=1, strideH=1, dilationWFactor=1,
                                dilationHFactor=1))
        mb.add_operator(BO.RESHAPE, [y4, mb.add_constant("s2", np.array([S, cout], np.int32))], [out])

    if kind == "f32":
        if shape == "FC":
            mb.add_operator(BO.FULLY_CONNECTED, [x, mb.add_constant("w", w), -1], [y], fc_opts)
        elif shape == "BMM":
            wt = mb.add_constant("wt", np.ascontiguousarray(w.T))
            mb.add_operator(BO.BATCH_MATMUL, [x, wt], [y], options("BatchMatMulOptions"))
        else:
            conv(mb.add_constant("f", w.reshape(cout, 1, 1, cin)), y, h_rows=shape == "CONV")
    elif kind == "int8":
        q, scale = quantize_rows(torch.from_numpy(w))
        q = np.asarray(q)
        scale = np.asarray(scale, np.float32).reshape(-1)
        if shape == "HCONV":
            filt = mb.add_constant("wq", q.reshape(cout, 1, 1, cin),
                                   quantization=QuantParams(tuple(scale.tolist()), (0,) * cout, 0))
            conv(filt, y)
            return serialize(mb, external=False).to_bytes()
        raw = mb.add_tensor("raw", [S, cout], F32)
        if shape == "FC":
            wq = mb.add_constant("wq", q, quantization=QuantParams(1.0, 0))
            mb.add_operator(BO.FULLY_CONNECTED, [x, wq, -1], [raw], fc_opts)
        elif shape == "DQ-FC":
            wq = mb.add_constant("wq", q, quantization=QuantParams(1.0, 0))
            wf = mb.add_tensor("wf", [cout, cin], F32)
            mb.add_operator(BO.DEQUANTIZE, [wq], [wf])
            mb.add_operator(BO.FULLY_CONNECTED, [x, wf, -1], [raw], fc_opts)
        else:
            wq = mb.add_constant("wq", q.reshape(cout, 1, 1, cin), quantization=QuantParams(1.0, 0))
            wf = mb.add_tensor("wf", [cout, 1, 1, cin], F32)
            mb.add_operator(BO.DEQUANTIZE, [wq], [wf])
            conv(wf, raw)
        mb.add_operator(BO.MUL, [raw, mb.add_constant("scale", scale.reshape(cout))], [y], options("MulOptions"))
    else:
        b = ggml.BY_NAME[kind]
        blocks = np.asarray(pack(torch.from_numpy(w), b, search=False)[0])
        wg = mb.add_tensor("wg", [cout, cin], b.circle_type, mb.add_buffer(blocks))
        if shape == "FC":
            mb.add_operator(BO.FULLY_CONNECTED, [x, wg, -1], [y], fc_opts)
        else:
            rows = mb.add_tensor("rows", [cout, cin], F32)
            mb.add_operator(BO.GATHER, [wg, mb.add_constant("all", np.arange(cout, dtype=np.int32))], [rows],
                            options("GatherOptions", axis=0, batchDims=0))
            filt = mb.add_tensor("filt", [cout, 1, 1, cin], F32)
            mb.add_operator(BO.RESHAPE, [rows, mb.add_constant("sf", np.array([cout, 1, 1, cin], np.int32))],
                            [filt])
            conv(filt, y)
    return serialize(mb, external=False).to_bytes()


def child(S: int, cin: int, cout: int, runs: int, forms: list[str], threads: list[int]) -> dict:
    """ms per call (median), CPU/wall and max |err| vs numpy of every (form, threads) session."""
    import onert

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((cout, cin)) / np.sqrt(cin)).astype(np.float32)
    x = rng.standard_normal((S, cin)).astype(np.float32)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    sessions, out = {}, {}
    with tempfile.TemporaryDirectory() as d:
        for f in forms:
            p = os.path.join(d, f.replace(" ", "_").replace("@", "_") + ".circle")
            with open(p, "wb") as fh:
                fh.write(build(f, S, cin, cout, w))
            for t in threads:
                # read when the session prepares (its first run), so set only around that
                env = {"NUM_THREADS": str(t)}
                if f.endswith("@ruy"):
                    env.update(OP_BACKEND_FullyConnected="ruy", OP_BACKEND_Conv2D="ruy")
                os.environ.update(env)
                try:
                    s = onert.infer.session(p, "cpu;ruy" if f.endswith("@ruy") else "cpu")
                    y = s.infer([x])[0]
                except Exception as e:  # a form onert does not run: reported, not fatal
                    out[f"{f} t{t}"] = {"error": str(e).splitlines()[0][:80]}
                    continue
                finally:
                    for k in env:
                        os.environ.pop(k, None)
                err = float(np.abs(y - ref).max() / np.abs(ref).max())
                sessions[f"{f} t{t}"] = s
                out[f"{f} t{t}"] = {"err": err, "ms": [], "cpu": 0.0, "wall": 0.0}
        for _ in range(runs):
            for key, s in sessions.items():
                t0, c0 = time.perf_counter(), time.process_time()
                s.infer([x])
                dt = time.perf_counter() - t0
                r = out[key]
                r["ms"].append(dt * 1e3)
                r["cpu"] += time.process_time() - c0
                r["wall"] += dt
    for key in sessions:
        r = out[key]
        r["cpu_ms"] = r["cpu"] / len(r["ms"]) * 1e3
        r["cw"] = r.pop("cpu") / r.pop("wall")
        r["ms"] = statistics.median(r["ms"])
    return out


def load() -> str:
    return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,16,128")
    ap.add_argument("--shapes", default=",".join(f"{i}x{o}" for i, o in LLAMA), help="INxOUT, comma separated")
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    forms, threads = args.forms.split(","), [int(t) for t in args.threads.split(",")]
    if args.child:
        S, cin, cout = (int(v) for v in args.child.split(","))
        print(json.dumps(child(S, cin, cout, args.runs, forms, threads)))
        return 0
    os.environ.setdefault("USE_MMAPED_DATA", "1")
    rows = [int(s) for s in args.rows.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    keys = [f"{f} t{t}" for f in forms for t in threads]
    print(f"onert 0.1.0 cpu backend, {os.cpu_count()} cores; {load()} at the start; median of {args.runs} "
          "interleaved calls, wall ms per call (CPU/wall), * = fastest at its bits per weight; CPU ms per call "
          "(all threads: the work done, whatever the load)")
    results = {}
    for cin, cout in shapes:
        for S in rows:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", f"{S},{cin},{cout}",
                                "--runs", str(args.runs), "--forms", args.forms, "--threads", args.threads],
                               capture_output=True, text=True)
            if p.returncode:
                print(f"{cin}x{cout} S={S}: child failed ({p.returncode}): "
                      f"{(p.stderr.strip().splitlines() or ['?'])[-1][:120]}")
                continue
            r = results[(cin, cout, S)] = json.loads(p.stdout.strip().splitlines()[-1])
            best = {}
            for k, v in r.items():
                if "ms" in v:
                    b = BITS[k.split(" ")[0]]
                    if b not in best or v["ms"] < r[best[b]]["ms"]:
                        best[b] = k
            print(f"\n{cin} x {cout}, S = {S} ({load()})")
            for k in keys:
                v = r.get(k, {"error": "not run"})
                if "error" in v:
                    print(f"  {k:<18} failed: {v['error']}")
                    continue
                mark = "*" if best.get(BITS[k.split(' ')[0]]) == k else " "
                print(f"  {k:<18}{v['ms']:>9.2f} ms ({v['cw']:.2f}){mark}  CPU {v['cpu_ms']:>8.2f} ms"
                      f"  rel. err {v['err']:.1e}")
    if all((i, o, S) in results for (i, o) in LLAMA for S in rows):
        print(f"\nbenchmark Llama, sum of its {sum(LLAMA.values())} layer linears per form (wall ms per forward, "
              f"then CPU ms; {load()} at the end)")
        print(f"{'form':<18}" + "".join(f"{'S=' + str(S):>10}" for S in rows)
              + "".join(f"{'CPU S=' + str(S):>12}" for S in rows))
        for k in keys:
            cells = []
            for col in ("ms", "cpu_ms"):
                for S in rows:
                    vals = [results[(i, o, S)].get(k, {}) for (i, o) in LLAMA]
                    ok = all("ms" in v for v in vals)
                    w = 10 if col == "ms" else 12
                    cells.append(f"{sum(v[col] * n for v, n in zip(vals, LLAMA.values())):>{w}.1f}" if ok else f"{'-':>{w}}")
            print(f"{k:<18}" + "".join(cells))
        for bits in (32, 8, 4):
            cells = []
            for col in ("ms", "cpu_ms"):
                for S in rows:
                    tot = 0.0
                    for (i, o), n in LLAMA.items():
                        cand = [v[col] for k, v in results[(i, o, S)].items()
                                if BITS[k.split(" ")[0]] == bits and "ms" in v]
                        tot = tot + min(cand) * n if cand and tot is not None else None
                    w = 10 if col == "ms" else 12
                    cells.append(f"{tot:>{w}.1f}" if tot is not None else f"{'-':>{w}}")
            print(f"{'best per linear ' + str(bits) + 'b':<18}" + "".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
