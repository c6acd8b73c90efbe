"""Probe: what one onert 0.1.0 session holds for a float32 linear weight, per op form.

The one-file LLM package's float32 runner peaked at weights + KV + 719 MiB (benchmarks/llm_package.py):
its prefill subgraph runs the linears as 1x1 CONV_2D and its decode subgraph as FULLY_CONNECTED, over
the same buffers. Each case below is one hand-built file whose ops read ONE 64 MiB float32 buffer
W [4096, 4096] (torch's [out, in]), in a fresh process: RSS (anon / file-backed) after the session
is created, after prepare, after the first run, and the peak (VmHWM).

  fc      FULLY_CONNECTED(x [R, K], W)
  conv    CONV_2D(x [1, R, 1, K], W as the filter [out, 1, 1, in], zero bias)   (prefill's form)
  bmm     BATCH_MATMUL(x [1, R, K], W, adj_y)                                   (no copy expected?)
  fc+conv both ops in one subgraph, both reading W                              (the package today)
  conv+conv two CONV_2D ops reading W (prefill and decode both as CONV_2D)
  fc+bmm  both ops in one subgraph, both reading W

Run: python docs/probes/linear_weight_copies.py   (results in docs/onert-findings.md)
"""
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
K, R = 4096, 32


def build(case):
    sys.path.insert(0, HERE)
    import if_entry_points as P
    from circle_schema import circle as C

    if "CONV_2D" not in P.CODES:
        P.CODES.append("CONV_2D")
    OPT = P.OPT
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((K, K)) * 0.02).astype(np.float32)
    m = P.Model()
    m.buffers = [b"", W.tobytes()]
    g = P.Graph(m)
    outs = []
    x = g.t([R, K])
    g.inputs = [x]
    if "fc" in case.split("+"):
        w = g.t([K, K], buf=1)
        outs.append(g.op("FULLY_CONNECTED", [x, w, -1], [g.t([R, K])], OPT.FullyConnectedOptions,
                         C.FullyConnectedOptions.FullyConnectedOptionsT()))
    for _ in range(case.split("+").count("conv")):
        w = g.t([K, 1, 1, K], buf=1)
        b = g.const(np.zeros(K, np.float32))
        xin = g.t([1, R, 1, K])
        g.inputs.append(xin)
        o = C.Conv2DOptions.Conv2DOptionsT()
        o.padding, o.strideW, o.strideH, o.dilationWFactor, o.dilationHFactor = 1, 1, 1, 1, 1  # VALID
        outs.append(g.op("CONV_2D", [xin, w, b], [g.t([1, R, 1, K])], OPT.Conv2DOptions, o))
    if "bmm" in case.split("+"):
        w = g.t([K, K], buf=1)
        bo = C.BatchMatMulOptions.BatchMatMulOptionsT()
        bo.adjointLhs, bo.adjointRhs = False, True
        outs.append(g.op("BATCH_MATMUL", [x, w], [g.t([R, K])], OPT.BatchMatMulOptions, bo))
    g.outputs = outs
    return m.to_file(f"lwc_{case.replace('+', '_')}"), W


def status():
    s = open("/proc/self/status").read()
    f = lambda k: int(s.split(k + ":")[1].split()[0]) / 1024  # noqa: E731
    return {"anon": round(f("RssAnon")), "file": round(f("RssFile")), "hwm": round(f("VmHWM"))}


def child(path):
    import onert
    from onert.native.libnnfw_api_pybind import prepare_config

    base = status()
    s = onert.infer.session(path).session
    created = status()
    s.set_prepare_config(prepare_config.ENABLE_INTERNAL_OUTPUT_ALLOC)
    s.prepare()
    prepared = status()
    x = np.random.default_rng(1).standard_normal((R, K)).astype(np.float32)
    for k in range(s.input_size()):
        s.set_input(k, x if k == 0 else x.reshape(1, R, 1, K))
    s.run()
    ran = status()
    print(json.dumps({"base": base, "created": created, "prepared": prepared, "ran": ran}))


def main():
    print(f"W = {K}x{K} float32 = {K * K * 4 / 2**20:.0f} MiB, {R} rows; MiB above the process before the session "
          "(anon + file-backed), peak = VmHWM")
    print("| case | USE_MMAPED_DATA | after create | after prepare | after run | peak VmHWM - base |")
    print("|---|---|---|---|---|---|")
    for case in ("fc", "conv", "bmm", "fc+conv", "conv+conv", "fc+bmm"):
        path, _ = build(case)
        for mm in ("0", "1"):
            env = dict(os.environ, USE_MMAPED_DATA=mm)
            r = subprocess.run([sys.executable, __file__, "--child", path], env=env, capture_output=True, text=True)
            if r.returncode:
                print(f"| {case} | {mm} | FAILED {r.stderr.strip().splitlines()[-1][:120]} | | | |")
                continue
            d = json.loads(r.stdout.strip().splitlines()[-1])
            b = d["base"]
            cell = lambda k: f"{d[k]['anon'] - b['anon']} + {d[k]['file'] - b['file']}"  # noqa: E731
            print(f"| {case} | {mm} | {cell('created')} | {cell('prepared')} | {cell('ran')} | "
                  f"{d['ran']['hwm'] - b['hwm']} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2])
    else:
        main()
