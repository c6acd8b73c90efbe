"""Probe: which one-file forms let ONE onert 0.1.0 session serve an LLM's entry points?

onert 0.1.0 runs subgraph 0 and ignores SignatureDefs; an IF on a bool [1] input switches
between two subgraphs exactly and constants read by several subgraphs are held once
(../shared/probes/if/if_shared_weights.py). Not known before this probe, each case below:

  shapes    IF branches whose inputs have different shapes ([1,P,K] prefill vs [1,1,K] decode),
            and IF outputs whose shapes differ between the branches: what shape onert gives them
  union     the fallback: each branch returns every output (the other branch's as a zeros constant)
  dynamic   a dynamic-length [1,-1,K] input into IF, rebound with set_input at other shapes
  copy      what IF costs per call when big inputs (KV caches) pass through it: copied or not?
  chain     a nested IF over cache-length buckets, each reading a STRIDED_SLICE prefix of the cache

Run: python docs/probes/if_entry_points.py  (prints one line per case; results in docs/onert-findings.md)
"""
import os
import tempfile
import time

import flatbuffers
import numpy as np
import onert
from circle_schema import circle as C
from onert.native.libnnfw_api_pybind import prepare_config

BO, TT, OPT = C.BuiltinOperator.BuiltinOperator, C.TensorType.TensorType, C.BuiltinOptions.BuiltinOptions
CODES = ["IF", "FULLY_CONNECTED", "ADD", "STRIDED_SLICE", "REDUCE_MAX", "LESS", "MUL", "BATCH_MATMUL"]
K = 256
rng = np.random.default_rng(0)
W = (rng.standard_normal((K, K)) * 0.05).astype(np.float32)


class Model:
    """A tiny hand-built Circle model: buffer 0 empty, buffer 1 = W (shared by every subgraph)."""

    def __init__(self):
        self.buffers = [b"", W.tobytes()]
        self.subgraphs = []

    def buf(self, arr):
        self.buffers.append(np.ascontiguousarray(arr).tobytes())
        return len(self.buffers) - 1

    def to_file(self, name):
        m = C.Model.ModelT()
        m.version = 3
        m.operatorCodes = []
        for n in CODES:
            c = C.OperatorCode.OperatorCodeT()
            v = getattr(BO, n)
            c.builtinCode, c.deprecatedBuiltinCode, c.version = v, min(v, 127), 1
            m.operatorCodes.append(c)
        m.buffers = []
        for data in self.buffers:
            b = C.Buffer.BufferT()
            b.data = np.frombuffer(data, np.uint8) if data else None
            m.buffers.append(b)
        m.subgraphs = [g.table() for g in self.subgraphs]
        fb = flatbuffers.Builder(0)
        fb.Finish(m.Pack(fb), file_identifier=b"CIR0")
        path = os.path.join(tempfile.gettempdir(), f"if_entry_{name}.circle")
        open(path, "wb").write(bytes(fb.Output()))
        return path


class Graph:
    def __init__(self, model):
        self.model, self.tensors, self.ops, self.inputs, self.outputs = model, [], [], [], []
        model.subgraphs.append(self)
        self.index = len(model.subgraphs) - 1

    def t(self, shape, ttype=TT.FLOAT32, buf=0, sig=None):
        t = C.Tensor.TensorT()
        t.name, t.shape, t.type, t.buffer = f"t{len(self.tensors)}", list(shape), ttype, buf
        if sig is not None:
            t.shapeSignature = list(sig)
        self.tensors.append(t)
        return len(self.tensors) - 1

    def const(self, arr):
        arr = np.asarray(arr)
        tt = {np.dtype(np.float32): TT.FLOAT32, np.dtype(np.int32): TT.INT32}[arr.dtype]
        return self.t(arr.shape, tt, self.model.buf(arr))

    def op(self, name, ins, outs, opt_type=0, opt=None):
        o = C.Operator.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = CODES.index(name), list(ins), list(outs)
        if opt is not None:
            o.builtinOptionsType, o.builtinOptions = opt_type, opt
        self.ops.append(o)
        return outs[0] if len(outs) == 1 else outs

    def fc(self, x, rows, sig=None):
        w = self.t([K, K], buf=1)
        y = self.t([rows, K], sig=sig)
        return self.op("FULLY_CONNECTED", [x, w, -1], [y], OPT.FullyConnectedOptions,
                       C.FullyConnectedOptions.FullyConnectedOptionsT())

    def add(self, a, b, shape, sig=None):
        return self.op("ADD", [a, b], [self.t(shape, sig=sig)], OPT.AddOptions, C.AddOptions.AddOptionsT())

    def iff(self, cond, ins, out_shapes, then_g, else_g, sigs=None):
        o = C.IfOptions.IfOptionsT()
        o.thenSubgraphIndex, o.elseSubgraphIndex = then_g.index, else_g.index
        outs = [self.t(s, sig=(sigs or [None] * len(out_shapes))[k]) for k, s in enumerate(out_shapes)]
        self.op("IF", [cond, *ins], outs, OPT.IfOptions, o)
        return outs

    def slice_rows(self, x, shape, rows):
        """x[:, :, :rows, :] of a [1,H,S,D] tensor."""
        o = C.StridedSliceOptions.StridedSliceOptionsT()
        begin, end = self.const(np.zeros(4, np.int32)), self.const(np.array([1, shape[1], rows, shape[3]], np.int32))
        st = self.const(np.ones(4, np.int32))
        return self.op("STRIDED_SLICE", [x, begin, end, st], [self.t([1, shape[1], rows, shape[3]])],
                       OPT.StridedSliceOptions, o)

    def attend(self, q, x, shape):
        """max_j q . x[:, :, j, :] for a query q [1,H,1,D]: what attention reads of a cache."""
        b, h, rows, d = shape
        bo = C.BatchMatMulOptions.BatchMatMulOptionsT()
        bo.adjointLhs, bo.adjointRhs = False, True
        s = self.op("BATCH_MATMUL", [q, x], [self.t([1, h, 1, rows])], OPT.BatchMatMulOptions, bo)
        o = C.ReducerOptions.ReducerOptionsT()
        o.keepDims = True
        axes = self.const(np.array([3], np.int32))
        return self.op("REDUCE_MAX", [s, axes], [self.t([1, h, 1, 1])], OPT.ReducerOptions, o)

    def table(self):
        g = C.SubGraph.SubGraphT()
        g.tensors, g.operators, g.inputs, g.outputs = self.tensors, self.ops, self.inputs, self.outputs
        g.name = f"sg{self.index}"
        return g


def session(path):
    s = onert.infer.session(path).session
    s.set_prepare_config(prepare_config.ENABLE_INTERNAL_OUTPUT_ALLOC)
    s.prepare()
    return s


def rss():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024


def info(s, k, arr):
    i = s.input_tensorinfo(k)
    i.rank, i.dims = arr.ndim, list(arr.shape)
    return i


def run(s, arrays, resize=False):
    for k, a in enumerate(arrays):
        if resize and a.dtype == np.float32:
            s.set_input_tensorinfo(k, info(s, k, a))
        s.set_input(k, a)
    s.run()
    return [s.get_output(k) for k in range(s.output_size())]


def two_branch(P, out_decl, sig_in=None, sig_out=None):
    """main(cond, a[1,P,K] (or [1,-1,K]), b[1,1,K]) -> IF -> then: FC(a) [P rows]; else: FC(b)+1 [1 row]."""
    m = Model()
    main, then_g, else_g = Graph(m), Graph(m), Graph(m)
    for g in (then_g, else_g):
        g.inputs = [g.t([P, K], sig=sig_in), g.t([1, K])]
    then_g.outputs = [then_g.fc(then_g.inputs[0], P, sig=sig_in)]
    y = else_g.fc(else_g.inputs[1], 1)
    else_g.outputs = [else_g.add(y, else_g.const(np.ones([1, K], np.float32)), [1, K])]
    cond, a, b = main.t([1], TT.BOOL), main.t([P, K], sig=sig_in), main.t([1, K])
    main.inputs = [cond, a, b]
    main.outputs = main.iff(cond, [a, b], [out_decl], then_g, else_g, sigs=[sig_out])
    return m


def case_shapes():
    P = 8
    a = rng.standard_normal((P, K)).astype(np.float32)
    b = rng.standard_normal((1, K)).astype(np.float32)
    for decl, sig in (([P, K], None), ([1, K], None), ([P, K], [-1, K])):
        name = f"shapes_{decl[0]}{'_dyn' if sig else ''}"
        try:
            s = session(two_branch(P, decl, sig_out=sig).to_file(name))
            t1 = run(s, [np.array([True]), a, b])[0]
            e1 = run(s, [np.array([False]), a, b])[0]
            t2 = run(s, [np.array([True]), a, b])[0]
            print(f"shapes: IF output declared {decl} sig {sig}: then -> {t1.shape} err "
                  f"{np.abs(t1 - a @ W.T).max() if t1.shape == (P, K) else 'shape!'}; else -> {e1.shape} err "
                  f"{np.abs(e1 - (b @ W.T + 1)).max() if e1.shape == (1, K) else 'shape!'}; then again -> {t2.shape} "
                  f"err {np.abs(t2 - a @ W.T).max() if t2.shape == (P, K) else 'shape!'}")
        except Exception as e:
            print(f"shapes: IF output declared {decl} sig {sig}: FAILED {type(e).__name__}: {str(e)[:150]}")


def case_dynamic():
    """a [-1,K] into IF; rebound at lengths 8, 3, 17 with set_input_tensorinfo + set_input."""
    try:
        s = session(two_branch(8, [8, K], sig_in=[-1, K], sig_out=[-1, K]).to_file("dynamic"))
        b = rng.standard_normal((1, K)).astype(np.float32)
        msgs = []
        for n in (8, 3, 17, 1):
            a = rng.standard_normal((n, K)).astype(np.float32)
            t = run(s, [np.array([True]), a, b], resize=True)[0]
            e = run(s, [np.array([False]), a, b], resize=True)[0]
            msgs.append(f"n={n}: then {t.shape} err {np.abs(t - a @ W.T).max() if t.shape == a.shape else 'shape!'}"
                        f", else {e.shape} err {np.abs(e - (b @ W.T + 1)).max() if e.shape == b.shape else 'shape!'}")
        print("dynamic: " + "; ".join(msgs))
    except Exception as e:
        print(f"dynamic: FAILED {type(e).__name__}: {str(e)[:200]}")


def cache_model(n_caches, shape, use_if, buckets=None):
    """main(cond, x[1,K], caches...) -> out = FC(x) + sum_i max_rows(cache_i) (through IF or not).
    buckets: a nested IF chain choosing a prefix length of the caches by LESS(position, bucket)."""
    m = Model()
    main = Graph(m)

    def body(g, rows):
        x, q = g.t([1, K]), g.t([1, shape[1], 1, shape[3]])
        cs = [g.t(shape) for _ in range(n_caches)]
        g.inputs = [x, q, *cs]
        acc, extra = g.fc(x, 1), []
        for c in cs:
            src = g.slice_rows(c, shape, rows) if rows != shape[2] else c
            extra.append(g.attend(q, src, [1, shape[1], rows, shape[3]]))
        g.outputs = [acc, *extra]
        return g

    outs = [[1, K]] + [[1, shape[1], 1, 1]] * n_caches
    if not use_if:
        g = body(main, shape[2])
        return m
    x, q = main.t([1, K]), main.t([1, shape[1], 1, shape[3]])
    cs = [main.t(shape) for _ in range(n_caches)]
    if buckets is None:
        cond = main.t([1], TT.BOOL)
        main.inputs = [cond, x, q, *cs]
        then_g, else_g = body(Graph(m), shape[2]), body(Graph(m), shape[2])
        main.outputs = main.iff(cond, [x, q, *cs], outs, then_g, else_g)
        return m
    pos = main.t([1], TT.INT32)
    main.inputs = [pos, x, q, *cs]

    def chain(g, pos_t, ins, k):
        """IF(pos < buckets[k]) -> bucket k, else -> chain(k+1); last bucket = full cache."""
        lt = g.op("LESS", [pos_t, g.const(np.array([buckets[k]], np.int32))], [g.t([1], TT.BOOL)])
        then_g = body(Graph(m), buckets[k])
        if k + 1 < len(buckets):
            else_g = Graph(m)
            p2, x2, q2 = else_g.t([1], TT.INT32), else_g.t([1, K]), else_g.t([1, shape[1], 1, shape[3]])
            c2 = [else_g.t(shape) for _ in range(n_caches)]
            else_g.inputs = [p2, x2, q2, *c2]
            else_g.outputs = chain(else_g, p2, [x2, q2, *c2], k + 1)
            then_g.inputs = [then_g.t([1], TT.INT32)] + then_g.inputs  # same arity as else
        else:
            else_g = body(Graph(m), shape[2])
            then_g.inputs = [then_g.t([1], TT.INT32)] + then_g.inputs
            else_g.inputs = [else_g.t([1], TT.INT32)] + else_g.inputs
        return g.iff(lt, [pos_t, *ins], outs, then_g, else_g)

    main.outputs = chain(main, pos, [x, q, *cs], 0)
    return m


def timeit(s, arrays, reps=20):
    for k, a in enumerate(arrays):
        s.set_input(k, a)
    s.run()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        s.run()
        t.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(t))


def case_copy():
    """60 caches [1,4,4096,64] (240 MiB) bound once; per-call time with and without an IF in front."""
    n, shape = 60, [1, 4, 4096, 64]
    caches = [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]
    x = rng.standard_normal((1, K)).astype(np.float32)
    q = np.ones([1, shape[1], 1, shape[3]], np.float32)
    plain = session(cache_model(n, shape, False).to_file("copy_plain"))
    tp = timeit(plain, [x, q, *caches])
    r0 = rss()
    s = session(cache_model(n, shape, True).to_file("copy_if"))
    ti = timeit(s, [np.array([True]), x, q, *caches])
    out = [s.get_output(k) for k in range(1, 3)]
    ok = all(np.allclose(o, c.sum(axis=3, keepdims=True).max(axis=2, keepdims=True), atol=1e-4) for o, c in zip(out, caches))
    print(f"copy: {n} caches {shape} ({n * np.prod(shape) * 4 / 2**20:.0f} MiB): plain {tp:.1f} ms/call, "
          f"through IF {ti:.1f} ms/call (exact {ok}); session+run RSS +{rss() - r0:.0f} MiB")


def case_chain():
    """Buckets 256/1024/4096 over 60 caches [1,4,4096,64]: time by position, results exact."""
    n, shape, buckets = 60, [1, 4, 4096, 64], [256, 1024]
    caches = [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]
    x = rng.standard_normal((1, K)).astype(np.float32)
    q = np.ones([1, shape[1], 1, shape[3]], np.float32)
    s = session(cache_model(n, shape, True, buckets=buckets).to_file("chain"))
    msgs = []
    for pos in (100, 1000, 4000):
        ms = timeit(s, [np.array([pos], np.int32), x, q, *caches])
        rows = next((b for b in buckets if pos < b), shape[2])
        out = [s.get_output(k) for k in range(1, 3)]
        ok = all(np.allclose(o, c[:, :, :rows].sum(axis=3, keepdims=True).max(axis=2, keepdims=True), atol=1e-4) for o, c in zip(out, caches))
        msgs.append(f"pos {pos} (bucket {rows}): {ms:.1f} ms exact {ok}")
    print("chain: " + "; ".join(msgs))


if __name__ == "__main__":
    case_shapes()
    case_dynamic()
    case_copy()
    case_chain()
