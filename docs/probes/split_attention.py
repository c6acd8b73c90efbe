"""Probe (issue 32 item 4): which Circle form of a one-token decode attention over a KV cache is
cheapest in onert 0.1.0, and which forms copy the cache?

SmolLM2-135M's geometry: 30 layers, 9 query heads in 3 groups of 3 over 3 K/V heads, head_dim 64;
each layer has its own K and V cache input [1, 3, S, 64] (bound once, as the runner binds them), the
new K/V row [1, 3, 1, 64] and the grouped query [1, 3, 3, 64] are inputs too, the mask is
LESS(row, position) as the decode step builds it (rows >= position hidden, the new row always seen).
Every layer's output is summed into one output. Forms (one file each):

  cat       today's decode step: CONCATENATION of cache and new row (K and V), grouped
            BATCH_MATMUL(q, K, adj_y), MUL scale, SELECT_V2 mask, SOFTMAX, BATCH_MATMUL(probs, V)
  where     the in-place form (slot-dependent models): SELECT_V2(row == position, new, cache)
  split     no copy of the cache: scores over the cache and over the new row by two BATCH_MATMULs
            (adj_y, reading the cache input itself), CONCATENATION of the *scores* ([1,3,3,S+1], small),
            the same mask + SOFTMAX, the probabilities split again (STRIDED_SLICE), then
            BATCH_MATMUL(p_past, V_cache) + p_new * v_new
  split_vt  split with the V cache kept transposed ([1, 3, 64, S]): BATCH_MATMUL(p_past, V^T, adj_y).
            cker's BatchMatMul transposes a rhs given without adj_y into a temporary on every call
            (compute/cker/include/cker/operation/BatchMatMul.h), i.e. copies V; with adj_y it reads it
  u8_vt     split_vt over uint8 caches (a quarter of the bytes), each layer's K and V^T DEQUANTIZEd into a float
            temporary first (onert has no float x uint8 BATCH_MATMUL): does a per-layer temporary that stays in cache beat
            reading float32 caches from memory?
  split_adjx split computing out^T = BATCH_MATMUL(V_cache, p_past, adj_x, adj_y): does adj_x copy V too?

Every form's output is compared with numpy; times are the median of REPS runs (ms per call, i.e. per
decode step's attention over all 30 layers), at S = 256 and 4096.

Run: python docs/probes/split_attention.py   (results in docs/onert-findings.md)
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import if_entry_points as P  # noqa: E402
from circle_schema import circle as C  # noqa: E402

for op in ("CONCATENATION", "SOFTMAX", "RESHAPE", "SELECT_V2", "EQUAL", "TRANSPOSE", "DEQUANTIZE"):
    if op not in P.CODES:
        P.CODES.append(op)
TT, OPT = P.TT, P.OPT
LAYERS, HK, REP, D = 30, 3, 3, 64
REPS = int(os.environ.get("REPS", "15"))
SCALE = 1 / np.sqrt(D)
LOWEST = np.finfo(np.float32).min
U8_SCALE = 4.0 / 127  # the uint8 form's per-tensor scale (zero point 128): standard-normal caches, clipped at 4


def bmm(g, a, b, shape, adj_x=False, adj_y=False):
    o = C.BatchMatMulOptions.BatchMatMulOptionsT()
    o.adjointLhs, o.adjointRhs = adj_x, adj_y
    return g.op("BATCH_MATMUL", [a, b], [g.t(shape)], OPT.BatchMatMulOptions, o)


def concat(g, xs, axis, shape):
    o = C.ConcatenationOptions.ConcatenationOptionsT()
    o.axis = axis
    return g.op("CONCATENATION", xs, [g.t(shape)], OPT.ConcatenationOptions, o)


def reshape(g, x, shape):
    o = C.ReshapeOptions.ReshapeOptionsT()
    o.newShape = list(shape)
    return g.op("RESHAPE", [x, g.const(np.array(shape, np.int32))], [g.t(shape)], OPT.ReshapeOptions, o)


def mul(g, a, b, shape):
    return g.op("MUL", [a, b], [g.t(shape)], OPT.MulOptions, C.MulOptions.MulOptionsT())


def select(g, c, a, b, shape):
    return g.op("SELECT_V2", [c, a, b], [g.t(shape)])


def softmax(g, x, shape):
    o = C.SoftmaxOptions.SoftmaxOptionsT()
    o.beta = 1.0
    return g.op("SOFTMAX", [x], [g.t(shape)], OPT.SoftmaxOptions, o)


def cols(g, x, shape, lo, hi):
    """x[..., lo:hi] of a 4-D tensor."""
    o = C.StridedSliceOptions.StridedSliceOptionsT()
    begin = g.const(np.array([0, 0, 0, lo], np.int32))
    end = g.const(np.array([shape[0], shape[1], shape[2], hi], np.int32))
    return g.op("STRIDED_SLICE", [x, begin, end, g.const(np.ones(4, np.int32))],
                [g.t(shape[:3] + [hi - lo])], OPT.StridedSliceOptions, o)


def probabilities(g, scores, mask, n):
    """scores [1,HK,REP,n] -> scaled, masked, SOFTMAX over [1,H,1,n] (the GQA lowering's order)."""
    s = reshape(g, scores, [1, HK * REP, 1, n])
    s = mul(g, s, g.const(np.array([SCALE], np.float32)), [1, HK * REP, 1, n])
    s = select(g, mask, s, g.const(np.array([LOWEST], np.float32)), [1, HK * REP, 1, n])
    return reshape(g, softmax(g, s, [1, HK * REP, 1, n]), [1, HK, REP, n])


def build(form, S):
    m = P.Model()
    g = P.Graph(m)
    pos, q = g.t([1], TT.INT32), g.t([1, HK, REP, D])
    kn, vn = g.t([1, HK, 1, D]), g.t([1, HK, 1, D])
    vshape = [1, HK, D, S] if form.endswith("_vt") else [1, HK, S, D]
    if form == "u8_vt":  # uint8 caches (per-tensor scale / zero point), each DEQUANTIZEd before its products
        raw = [(g.t([1, HK, S, D], TT.UINT8), g.t(vshape, TT.UINT8)) for _ in range(LAYERS)]
        for kv in raw:
            for t in kv:
                qp = C.QuantizationParameters.QuantizationParametersT()
                qp.scale, qp.zeroPoint = [U8_SCALE], [128]
                g.tensors[t].quantization = qp
        g.inputs = [pos, q, kn, vn] + [t for kv in raw for t in kv]
        caches = [(g.op("DEQUANTIZE", [k], [g.t([1, HK, S, D])]), g.op("DEQUANTIZE", [v], [g.t(vshape)]))
                  for k, v in raw]
        form = "split_vt"
    else:
        caches = [(g.t([1, HK, S, D]), g.t(vshape)) for _ in range(LAYERS)]
        g.inputs = [pos, q, kn, vn] + [t for kv in caches for t in kv]
    out_shape = [1, HK, REP, D]
    if form.startswith("gemv"):
        return build_gemv(m, g, pos, q, kn, vn, caches, S, form == "gemv_vt")
    if form in ("cat", "split", "split_vt", "split_adjx"):
        lo = np.concatenate([np.arange(S), [-1]]).astype(np.int32).reshape(1, 1, 1, S + 1)
        mask = g.op("LESS", [g.const(lo), pos], [g.t([1, 1, 1, S + 1], TT.BOOL)])
    else:  # where: the new row written at position, key slot j = position j; rows <= position seen
        rows = np.arange(S).astype(np.int32)
        mask = g.op("LESS", [g.const((rows - 1).reshape(1, 1, 1, S)), pos], [g.t([1, 1, 1, S], TT.BOOL)])
        write_at = g.op("EQUAL", [g.const(rows.reshape(1, 1, S, 1)), pos], [g.t([1, 1, S, 1], TT.BOOL)])
    acc = None
    for kc, vc in caches:
        if form == "cat":
            k = concat(g, [kc, kn], 2, [1, HK, S + 1, D])
            v = concat(g, [vc, vn], 2, [1, HK, S + 1, D])
            p = probabilities(g, bmm(g, q, k, [1, HK, REP, S + 1], adj_y=True), mask, S + 1)
            o = bmm(g, p, v, out_shape)
        elif form == "where":
            k = select(g, write_at, kn, kc, [1, HK, S, D])
            v = select(g, write_at, vn, vc, [1, HK, S, D])
            p = probabilities(g, bmm(g, q, k, [1, HK, REP, S], adj_y=True), mask, S)
            o = bmm(g, p, v, out_shape)
        else:
            sp = bmm(g, q, kc, [1, HK, REP, S], adj_y=True)
            sn = bmm(g, q, kn, [1, HK, REP, 1], adj_y=True)
            p = probabilities(g, concat(g, [sp, sn], 3, [1, HK, REP, S + 1]), mask, S + 1)
            pp, pn = cols(g, p, [1, HK, REP, S + 1], 0, S), cols(g, p, [1, HK, REP, S + 1], S, S + 1)
            if form == "split":
                op = bmm(g, pp, vc, out_shape)
            elif form == "split_vt":
                op = bmm(g, pp, vc, out_shape, adj_y=True)
            else:
                ot = bmm(g, vc, pp, [1, HK, D, REP], adj_x=True, adj_y=True)
                perm = g.const(np.array([0, 1, 3, 2], np.int32))
                op = g.op("TRANSPOSE", [ot, perm], [g.t(out_shape)], OPT.TransposeOptions,
                          C.TransposeOptions.TransposeOptionsT())
            o = g.add(op, mul(g, pn, vn, out_shape), out_shape)
        acc = o if acc is None else g.add(acc, o, out_shape)
    g.outputs = [acc]
    return m


def transpose(g, x, perm, shape):
    return g.op("TRANSPOSE", [x, g.const(np.array(perm, np.int32))], [g.t(shape)], OPT.TransposeOptions,
                C.TransposeOptions.TransposeOptionsT())


def build_gemv(m, g, pos, q, kn, vn, caches, S, vt):
    """One query row per BATCH_MATMUL batch: q [1,HK,REP,D] -> [REP,HK,1,D] (a small TRANSPOSE), whose
    batch dims (REP, HK) broadcast against the cache's (1, HK): cker's Gemm then multiplies a matrix
    by one vector per batch (no packing of the cache), reading the cache input itself."""
    lo = np.concatenate([np.arange(S), [-1]]).astype(np.int32).reshape(1, 1, 1, S + 1)
    mask = g.op("LESS", [g.const(lo), pos], [g.t([1, 1, 1, S + 1], TT.BOOL)])
    qt = transpose(g, q, [2, 1, 0, 3], [REP, HK, 1, D])
    acc = None
    n = S + 1
    for kc, vc in caches:
        sp = bmm(g, qt, kc, [REP, HK, 1, S], adj_y=True)
        sn = bmm(g, qt, kn, [REP, HK, 1, 1], adj_y=True)
        s = concat(g, [sp, sn], 3, [REP, HK, 1, n])
        s = mul(g, s, g.const(np.array([SCALE], np.float32)), [REP, HK, 1, n])
        s = select(g, mask, s, g.const(np.array([LOWEST], np.float32)), [REP, HK, 1, n])
        p = softmax(g, s, [REP, HK, 1, n])
        pp, pn = cols(g, p, [REP, HK, 1, n], 0, S), cols(g, p, [REP, HK, 1, n], S, n)
        op = bmm(g, pp, vc, [REP, HK, 1, D], adj_y=vt)
        o = g.add(op, mul(g, pn, vn, [REP, HK, 1, D]), [REP, HK, 1, D])
        acc = o if acc is None else g.add(acc, o, [REP, HK, 1, D])
    g.outputs = [transpose(g, acc, [2, 1, 0, 3], [1, HK, REP, D])]
    return m


def reference(q, kn, vn, caches, position, S, vt):
    """float64 numpy: each layer attends over cache rows < position plus the new row."""
    total = 0
    for kc, vc in caches:
        vc = np.swapaxes(vc, 2, 3) if vt else vc
        k = np.concatenate([kc[:, :, :position], kn], 2).astype(np.float64)
        v = np.concatenate([vc[:, :, :position], vn], 2).astype(np.float64)
        s = q @ np.swapaxes(k, 2, 3) * SCALE
        p = np.exp(s - s.max(-1, keepdims=True))
        total = total + (p / p.sum(-1, keepdims=True)) @ v
    return total


def sessions(forms, S, position):
    """One session per form over the same cache arrays (the V caches also transposed for *_vt forms);
    returns {form: (session, relative error vs numpy)}."""
    rng = np.random.default_rng(0)
    q, kn, vn = (rng.standard_normal(s).astype(np.float32) for s in ([1, HK, REP, D], [1, HK, 1, D], [1, HK, 1, D]))
    caches = [(rng.standard_normal([1, HK, S, D]).astype(np.float32), rng.standard_normal([1, HK, S, D]).astype(np.float32))
              for _ in range(LAYERS)]
    transposed = [(k, np.ascontiguousarray(np.swapaxes(v, 2, 3))) for k, v in caches]
    want = reference(q, kn, vn, caches, position, S, False)
    out = {}
    for form in forms:
        try:
            s = P.session(build(form, S).to_file(f"split_{form}_{S}"))
        except Exception as e:
            print(f"{form} S={S}: FAILED to load {type(e).__name__}: {str(e)[:150]}")
            continue
        kv = transposed if form.endswith("_vt") else caches
        if form == "u8_vt":
            kv = [tuple(np.clip(np.round(t / U8_SCALE) + 128, 0, 255).astype(np.uint8) for t in pair) for pair in kv]
        arrays = [np.array([position], np.int32), q, kn, vn] + [t for pair in kv for t in pair]
        for k, a in enumerate(arrays):
            s.set_input(k, a)
        s.run()
        ref = want
        if form == "u8_vt":  # against the dequantized caches' attention
            deq = [tuple((t.astype(np.float64) - 128) * U8_SCALE for t in pair) for pair in kv]
            ref = reference(q, kn, vn, deq, position, S, True)
        out[form] = (s, float(np.abs(s.get_output(0) - ref).max() / np.abs(ref).max()), arrays)
    return out


def measure(forms, S, position):
    """Interleaved: each round runs every form once (the machine's load varies over seconds)."""
    live = sessions(forms, S, position)
    times = {f: [] for f in live}
    for _ in range(REPS):
        for f, (s, _, _) in live.items():
            t0 = time.perf_counter()
            s.run()
            times[f].append(1e3 * (time.perf_counter() - t0))
    for f, (s, err, _) in live.items():
        print(f"{f:10s} S={S:5d} pos {position:5d}: median {np.median(times[f]):6.2f} ms, min {min(times[f]):6.2f} ms"
              f" (30 layers, {REPS} interleaved rounds), rel err {err:.1e}", flush=True)


if __name__ == "__main__":
    forms = sys.argv[1:] or ["cat", "where", "split", "split_vt", "split_adjx", "gemv", "gemv_vt", "u8_vt"]
    print(f"load average {os.getloadavg()}")
    for S, position in ((256, 100), (4096, 4000)):
        measure(forms, S, position)
    print(f"load average {os.getloadavg()}")
