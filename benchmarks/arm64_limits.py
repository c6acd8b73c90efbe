"""Which of onert 0.1.0's x86 limits also hold on its aarch64 build: one-operator Circle files, each
run in x86 onert and in arm64 onert (qemu-user, ``circle_fx.circle.arm64``) and compared with numpy.

    PYTHONPATH=$PWD python scripts/arm64.py setup      # once
    PYTHONPATH=$PWD python benchmarks/arm64_limits.py  # prints the table (docs/onert-findings.md, aarch64)

Each probe is the file that shows the limit on x86 (docs/onert-findings.md, ../shared/onert-0.1.0-matrix.md):
ROPE over several positions, a hybrid FULLY_CONNECTED with per-channel int8 scales or uint8 weights,
QUANTIZE to int8, SPLIT_V, GATHER from a GGML_Q8_0 / int8 table, a GGML FC with a bias. The files are
written with circle_schema's object API directly (not by circle_fx, which never emits these forms) and
run unverified on purpose, so x86 runs in a child process (a crash there is a row, not the end).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _model(ops, tensors, inputs, outputs) -> bytes:
    """``tensors``: (name, shape, type, data or None, quant dict or None); ``ops``: (code, ins, outs, options)."""
    import flatbuffers
    from circle_schema import circle as C

    m = C.Model.ModelT()
    m.version = 3
    codes = sorted({op[0] for op in ops})
    m.operatorCodes = []
    for code in codes:
        oc = C.OperatorCode.OperatorCodeT()
        oc.builtinCode = code
        oc.deprecatedBuiltinCode = code if code < 127 else 127
        oc.version = 1
        m.operatorCodes.append(oc)
    m.buffers = [C.Buffer.BufferT()]
    sg = C.SubGraph.SubGraphT()
    sg.tensors = []
    for name, shape, tt, data, quant in tensors:
        t = C.Tensor.TensorT()
        t.name, t.shape, t.type, t.buffer = name, list(shape), tt, 0
        if data is not None:
            b = C.Buffer.BufferT()
            b.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
            m.buffers.append(b)
            t.buffer = len(m.buffers) - 1
        if quant:
            q = C.QuantizationParameters.QuantizationParametersT()
            q.scale = [float(s) for s in np.atleast_1d(quant["scale"])]
            q.zeroPoint = [int(z) for z in np.atleast_1d(quant["zp"])]
            q.quantizedDimension = quant.get("dim", 0)
            t.quantization = q
        sg.tensors.append(t)
    sg.operators = []
    for code, ins, outs, (otype, opts) in ops:
        op = C.Operator.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = codes.index(code), list(ins), list(outs)
        if otype:
            op.builtinOptionsType, op.builtinOptions = otype, opts
        sg.operators.append(op)
    sg.inputs, sg.outputs = list(inputs), list(outputs)
    m.subgraphs = [sg]
    b = flatbuffers.Builder(0)
    b.Finish(m.Pack(b), file_identifier=b"CIR0")
    return bytes(b.Output())


def probes():
    """(name, x86 limit, file bytes, inputs, reference outputs)."""
    from circle_schema import circle as C

    from circle_fx.circle import ggml
    from circle_fx.circle.schema import BO, BOPT, TT, make_options

    rng = np.random.default_rng(0)
    out = []

    # ROPE (GPT_NEOX) over 4 positions: onert x86 applies the first position's row to all of them
    S, D = 4, 8
    x = rng.standard_normal((1, 1, S, D)).astype(np.float32)
    ang = np.arange(S)[:, None] * (1.0 / 10000 ** (np.arange(D // 2) * 2 / D))[None]
    ang = np.concatenate([ang, ang], -1).astype(np.float32)
    sin, cos = np.sin(ang)[None, None], np.cos(ang)[None, None]
    rot = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], -1)
    opts = make_options("RoPEOptions", mode=0)
    out.append(("ROPE, 4 positions in one call", "WRONG: row 0 of the tables for every position",
                _model([(BO.ROPE, [0, 1, 2], [3], (BOPT.RoPEOptions, opts))],
                       [("x", x.shape, TT.FLOAT32, None, None), ("sin", sin.shape, TT.FLOAT32, sin, None),
                        ("cos", cos.shape, TT.FLOAT32, cos, None), ("y", x.shape, TT.FLOAT32, None, None)], [0], [3]),
                [x], [x * cos + rot * sin]))

    # hybrid FC: float input, int8 weight with one scale per row (quantizedDimension 0)
    O, I = 8, 32
    xin = rng.standard_normal((2, I)).astype(np.float32)
    q = rng.integers(-127, 128, (O, I)).astype(np.int8)
    s = (0.01 * 2.0 ** np.arange(O) / 8).astype(np.float32)
    fc = (BOPT.FullyConnectedOptions, C.FullyConnectedOptions.FullyConnectedOptionsT())
    ref = xin @ (q.astype(np.float32) * s[:, None]).T
    out.append(("hybrid FC, int8 per-channel scales", "WRONG: only scale[0] used",
                _model([(BO.FULLY_CONNECTED, [0, 1, -1], [2], fc)],
                       [("x", xin.shape, TT.FLOAT32, None, None), ("w", q.shape, TT.INT8, q, {"scale": s, "zp": [0] * O}),
                        ("y", (2, O), TT.FLOAT32, None, None)], [0], [2]), [xin], [ref]))

    # hybrid FC with uint8 asymmetric weights (zero point 128)
    u = (q.astype(np.int16) + 128).astype(np.uint8)
    ref = xin @ (q.astype(np.float32) * 0.02).T
    out.append(("hybrid FC, uint8 weights (zp 128)", "WRONG: bytes read as int8, zp ignored",
                _model([(BO.FULLY_CONNECTED, [0, 1, -1], [2], fc)],
                       [("x", xin.shape, TT.FLOAT32, None, None), ("w", u.shape, TT.UINT8, u, {"scale": 0.02, "zp": 128}),
                        ("y", (2, O), TT.FLOAT32, None, None)], [0], [2]), [xin], [ref]))

    # QUANTIZE float -> int8, then DEQUANTIZE (int8 DEQUANTIZE is exact on x86): the round trip
    xq = np.linspace(-2, 2, 64, dtype=np.float32)[None]
    sc, zp = 0.02, 10
    ref = ((np.clip(np.round(xq / sc) + zp, -128, 127) - zp) * sc).astype(np.float32)
    out.append(("QUANTIZE float -> int8 (zp 10), DEQUANTIZE back", "WRONG: negatives clamp to 0, > 127 wraps",
                _model([(BO.QUANTIZE, [0], [1], (0, None)), (BO.DEQUANTIZE, [1], [2], (0, None))],
                       [("x", xq.shape, TT.FLOAT32, None, None), ("q", xq.shape, TT.INT8, None, {"scale": sc, "zp": zp}),
                        ("y", xq.shape, TT.FLOAT32, None, None)], [0], [2]), [xq], [ref]))

    # SPLIT_V into unequal pieces
    xs = rng.standard_normal((1, 10)).astype(np.float32)
    sv = C.SplitVOptions.SplitVOptionsT()
    sv.numSplits = 2
    out.append(("SPLIT_V [3, 7] on axis 1", "WRONG: returns zeros",
                _model([(BO.SPLIT_V, [0, 1, 2], [3, 4], (BOPT.SplitVOptions, sv))],
                       [("x", xs.shape, TT.FLOAT32, None, None), ("sizes", (2,), TT.INT32, np.array([3, 7], np.int32), None),
                        ("axis", (), TT.INT32, np.array(1, np.int32), None), ("a", (1, 3), TT.FLOAT32, None, None),
                        ("b", (1, 7), TT.FLOAT32, None, None)], [0], [3, 4]), [xs], [xs[:, :3], xs[:, 3:]]))

    # GATHER from GGML tables
    V, Dg = 64, 64
    table = (rng.standard_normal((V, Dg)) * 0.1).astype(np.float32)
    ids = np.array([[3, 17, 63, 0]], np.int32)
    gopt = C.GatherOptions.GatherOptionsT()
    for kind, tt in (("q8_0", TT.GGML_Q8_0), ("q4_0", TT.GGML_Q4_0)):
        packed, deq = _ggml(table, kind)
        out.append((f"GATHER from a GGML_{kind.upper()} table", "fails at run" if kind == "q8_0" else "exact",
                    _model([(BO.GATHER, [0, 1], [2], (BOPT.GatherOptions, gopt))],
                           [("t", (V, Dg), tt, packed, None), ("ids", ids.shape, TT.INT32, None, None),
                            ("y", (1, 4, Dg), TT.FLOAT32, None, None)], [1], [2]), [ids], [deq[ids]]))
    # GATHER from an int8 table
    qt = rng.integers(-127, 128, (V, Dg)).astype(np.int8)
    out.append(("GATHER from an int8 table", "fails at run (unsupported type)",
                _model([(BO.GATHER, [0, 1], [2], (BOPT.GatherOptions, gopt))],
                       [("t", (V, Dg), TT.INT8, qt, {"scale": 1.0, "zp": 0}), ("ids", ids.shape, TT.INT32, None, None),
                        ("y", (1, 4, Dg), TT.INT8, None, {"scale": 1.0, "zp": 0})], [1], [2]), [ids], [qt[ids]]))
    # GGML FC with and without a bias input
    w = (rng.standard_normal((O, Dg)) * 0.1).astype(np.float32)
    xg = rng.standard_normal((3, Dg)).astype(np.float32)
    bias = rng.standard_normal(O).astype(np.float32)
    for kind, tt in (("q8_0", TT.GGML_Q8_0), ("q4_0", TT.GGML_Q4_0)):
        packed, deq = _ggml(w, kind)
        out.append((f"FC with a GGML_{kind.upper()} weight (no bias)", "runs (~0.4 % error: activations per 32-block)",
                    _model([(BO.FULLY_CONNECTED, [0, 1, -1], [2], fc)],
                           [("x", xg.shape, TT.FLOAT32, None, None), ("w", (O, Dg), tt, packed, None),
                            ("y", (3, O), TT.FLOAT32, None, None)], [0], [2]), [xg], [xg @ deq.T]))
    packed, deq = _ggml(w, "q8_0")
    out.append(("FC with a GGML_Q8_0 weight and a bias", "throws at run",
                _model([(BO.FULLY_CONNECTED, [0, 1, 2], [3], fc)],
                       [("x", xg.shape, TT.FLOAT32, None, None), ("w", (O, Dg), TT.GGML_Q8_0, packed, None),
                        ("b", (O,), TT.FLOAT32, bias, None), ("y", (3, O), TT.FLOAT32, None, None)], [0], [3]),
                [xg], [xg @ deq.T + bias]))
    return out


def _ggml(w: np.ndarray, kind: str):
    """(packed bytes as uint8, dequantized float) with gguf-py's reference rounding (llama.cpp's)."""
    from gguf.quants import dequantize, quantize
    from gguf import GGMLQuantizationType as Q

    t = {"q8_0": Q.Q8_0, "q4_0": Q.Q4_0}[kind]
    packed = quantize(w, t)
    return packed, dequantize(packed, t).reshape(w.shape).astype(np.float32)


_CHILD = """
import pickle, sys, numpy as np, onert
path, inputs = sys.argv[1], pickle.load(open(sys.argv[2], "rb"))
s = onert.infer.session(path, "cpu")
pickle.dump([np.asarray(o) for o in s.infer(inputs)], open(sys.argv[3], "wb"))
"""


def run_x86(path: str, inputs) -> list | str:
    import pickle

    with tempfile.TemporaryDirectory() as d:
        i, o = os.path.join(d, "in.pkl"), os.path.join(d, "out.pkl")
        pickle.dump(inputs, open(i, "wb"))
        p = subprocess.run([sys.executable, "-c", _CHILD, path, i, o], capture_output=True, text=True,
                           env=dict(os.environ, NUM_THREADS="1"), timeout=120)
        if p.returncode:
            lines = [ln for ln in (p.stderr or "").strip().splitlines() if ln.strip()]
            return f"fails (exit {p.returncode}): {lines[-1][:120] if lines else ''}"
        return pickle.load(open(o, "rb"))


def run_arm(rt, path: str, inputs) -> list | str:
    from circle_fx.errors import RuntimeFailure

    try:
        h = rt.call("open", path, False)
        return rt.call("infer", h, inputs)
    except RuntimeFailure as e:
        return "fails: " + str(e).splitlines()[0][-120:]


def err(got, want) -> str:
    if isinstance(got, str):
        return got
    e = max(float(np.abs(g.astype(np.float64) - w).max()) / (float(np.abs(w).max()) or 1.0) for g, w in zip(got, want))
    return f"{e:.2g}"


def main() -> int:
    from circle_fx.circle.arm64 import Arm64Runtime

    rows = []
    with tempfile.TemporaryDirectory() as d, Arm64Runtime() as rt:
        for k, (name, known, data, inputs, want) in enumerate(probes()):
            path = os.path.join(d, f"p{k}.circle")
            open(path, "wb").write(data)
            x86, arm = run_x86(path, inputs), run_arm(rt, path, inputs)
            rows.append({"probe": name, "x86 (recorded)": known, "x86": err(x86, want), "arm64": err(arm, want),
                         "arm64 - x86": err(arm, x86) if not isinstance(arm, str) and not isinstance(x86, str) else ""})
    print("max |out - numpy| / max |numpy| (\"fails\": the runtime's error)\n")
    print("| probe | x86 limit recorded | x86 now | arm64 | max rel arm64 - x86 |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['probe']} | {r['x86 (recorded)']} | {r['x86']} | {r['arm64']} | {r['arm64 - x86']} |")
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
