"""Probe (issue 32 item 6): can onert 0.1.0 compute with a uint8 KV cache given at run time?

Each form is one hand-built file with a uint8 input q [1, 4, 256, 64] (a cache as the host keeps it) and,
where the form needs them, float scales; one session each, the output compared with numpy:

  dequantize  DEQUANTIZE(q) with per-tensor scale / zero point in q's quantization parameters
  cast        (CAST(q -> float32) - zero_point) * scale, scale a run-time float input [1, 4, 256, 1] (per token)
  quantize    QUANTIZE(x float32 [1, 4, 1, 64]) -> uint8 (the new row written by the decode step)
  bmm_uint8   BATCH_MATMUL(x float [1, 4, 1, 64], q uint8 as a quantized tensor, adj_y): hybrid attention

Run: python docs/probes/uint8_kv_cache.py   (results in docs/onert-findings.md)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import if_entry_points as P  # noqa: E402
from circle_schema import circle as C  # noqa: E402

for op in ("DEQUANTIZE", "QUANTIZE", "CAST", "SUB"):
    if op not in P.CODES:
        P.CODES.append(op)
TT, OPT = P.TT, P.OPT
SHAPE = [1, 4, 256, 64]
rng = np.random.default_rng(0)
q = rng.integers(0, 256, SHAPE, dtype=np.uint8)
S, ZP = 0.02, 128


def qparams(t, scale, zp):
    qp = C.QuantizationParameters.QuantizationParametersT()
    qp.scale, qp.zeroPoint = [scale], [zp]
    t.quantization = qp


def session(m, name):
    return P.session(m.to_file(name))


def case(name, build, inputs, want):
    try:
        s = session(*build())
        got = P.run(s, inputs)[0]
        err = np.abs(got.astype(np.float64) - want).max() if got.shape == want.shape else f"shape {got.shape}"
        print(f"{name}: runs, output {got.dtype} {got.shape}, max |err| {err}")
    except Exception as e:
        print(f"{name}: FAILED {type(e).__name__}: {str(e)[:200]}")


def dequantize():
    m = P.Model(); g = P.Graph(m)
    x = g.t(SHAPE, TT.UINT8); qparams(g.tensors[x], S, ZP)
    g.inputs = [x]
    g.outputs = [g.op("DEQUANTIZE", [x], [g.t(SHAPE)])]
    return m, "u8_dequantize"


def cast():
    m = P.Model(); g = P.Graph(m)
    x, sc = g.t(SHAPE, TT.UINT8), g.t(SHAPE[:3] + [1])
    g.inputs = [x, sc]
    o = C.CastOptions.CastOptionsT(); o.inDataType, o.outDataType = TT.UINT8, TT.FLOAT32
    f = g.op("CAST", [x], [g.t(SHAPE)], OPT.CastOptions, o)
    z = g.op("SUB", [f, g.const(np.array([ZP], np.float32))], [g.t(SHAPE)], OPT.SubOptions, C.SubOptions.SubOptionsT())
    g.outputs = [g.op("MUL", [z, sc], [g.t(SHAPE)], OPT.MulOptions, C.MulOptions.MulOptionsT())]
    return m, "u8_cast"


def quantize():
    m = P.Model(); g = P.Graph(m)
    x = g.t([1, 4, 1, 64]); g.inputs = [x]
    y = g.t([1, 4, 1, 64], TT.UINT8); qparams(g.tensors[y], S, ZP)
    g.outputs = [g.op("QUANTIZE", [x], [y])]
    return m, "u8_quantize"


def bmm_uint8():
    m = P.Model(); g = P.Graph(m)
    x, k = g.t([1, 4, 1, 64]), g.t(SHAPE, TT.UINT8); qparams(g.tensors[k], S, ZP)
    g.inputs = [x, k]
    bo = C.BatchMatMulOptions.BatchMatMulOptionsT(); bo.adjointLhs, bo.adjointRhs = False, True
    g.outputs = [g.op("BATCH_MATMUL", [x, k], [g.t([1, 4, 1, 256])], OPT.BatchMatMulOptions, bo)]
    return m, "u8_bmm"


if __name__ == "__main__":
    deq = (q.astype(np.float64) - ZP) * S
    scales = rng.uniform(0.01, 0.03, SHAPE[:3] + [1]).astype(np.float32)
    x = rng.standard_normal([1, 4, 1, 64]).astype(np.float32)
    case("dequantize (per-tensor qparams, run-time uint8 input)", dequantize, [q], deq)
    case("cast + sub + mul (per-token run-time scales)", cast, [q, scales], (q.astype(np.float64) - ZP) * scales)
    case("quantize (new row -> uint8)", quantize, [x], np.clip(np.round(x / S) + ZP, 0, 255))
    case("batch_matmul float x uint8", bmm_uint8, [x, q], x.astype(np.float64) @ np.swapaxes(deq, -1, -2))
