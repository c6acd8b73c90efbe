"""Probe (issue 32 item 4): a decode cache-length bucket reads the first rows of the whole caches.
SLICE vs STRIDED_SLICE in onert 0.1.0 for 60 caches: keys [1,3,4096,64] -> [1,3,256,64] (3 contiguous runs)
and transposed values [1,3,64,4096] -> [1,3,64,256] (192 runs of 256 floats); 30 interleaved rounds.

Run: python docs/probes/cache_slices.py   (results in docs/onert-findings.md)
"""
import os
import sys
import time

import numpy as np
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import if_entry_points as P
from circle_schema import circle as C
for op in ("SLICE",):
    if op not in P.CODES: P.CODES.append(op)
TT, OPT = P.TT, P.OPT
def build(kind, shape, out):
    m = P.Model(); g = P.Graph(m)
    xs = [g.t(shape) for _ in range(60)]
    g.inputs = xs
    outs = []
    for x in xs:
        if kind == "strided":
            o = C.StridedSliceOptions.StridedSliceOptionsT()
            outs.append(g.op("STRIDED_SLICE", [x, g.const(np.zeros(4, np.int32)), g.const(np.array(out, np.int32)), g.const(np.ones(4, np.int32))], [g.t(out)], OPT.StridedSliceOptions, o))
        else:
            outs.append(g.op("SLICE", [x, g.const(np.zeros(4, np.int32)), g.const(np.array(out, np.int32))], [g.t(out)], OPT.SliceOptions, C.SliceOptions.SliceOptionsT()))
    g.outputs = outs
    return m
rng = np.random.default_rng(0)
res = {}
for name, shape, out in (("rows", [1,3,4096,64], [1,3,256,64]), ("cols", [1,3,64,4096], [1,3,64,256])):
    arrs = [rng.standard_normal(shape).astype(np.float32) for _ in range(60)]
    sess = {}
    for kind in ("strided", "slice"):
        s = P.session(build(kind, shape, out).to_file(f"nocopy_{kind}_{name}"))
        for i, a in enumerate(arrs): s.set_input(i, a)
        s.run()
        ok = np.array_equal(s.get_output(0), arrs[0][tuple(slice(0, d) for d in out)])
        sess[kind] = (s, ok)
    t = {k: [] for k in sess}
    for _ in range(30):
        for k, (s, _) in sess.items():
            t0 = time.perf_counter(); s.run(); t[k].append(1e3 * (time.perf_counter() - t0))
    for k in sess:
        print(f"{name} {k}: median {np.median(t[k]):.2f} ms min {min(t[k]):.2f} ms (60 slices) exact {sess[k][1]}")
