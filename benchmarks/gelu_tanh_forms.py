"""GELU (tanh approximation) in onert: the hand-written formula as elementwise ops vs one GELU.

GPT-2's MLP activation (``gelu_new``) exported with the ``gelu_tanh`` fusion removed from
the pipeline (MUL/POW/ADD/TANH, as circle_fx emitted it before the family existed) and with
it (one GELU, ``approximate=True``). Prints op counts, onert time per call (median of
``--runs``, interleaved) and the max difference to eager.

    python benchmarks/gelu_tanh_forms.py            # [1, 128, 3072]: one GPT-2 MLP, 128 tokens
    python benchmarks/gelu_tanh_forms.py --shape 1,1,3072
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import circle_fx  # noqa: E402


class NewGelu(torch.nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1,128,3072")
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args(argv)
    shape = [int(s) for s in args.shape.split(",")]
    x = torch.randn(*shape) * 3
    want = NewGelu()(x).numpy()
    forms = {"decomposed": circle_fx.export(NewGelu(), (x,), passes=circle_fx.default_pipeline().remove_pass("fuse_gelu_tanh")),
             "fused GELU": circle_fx.export(NewGelu(), (x,))}
    times = {k: [] for k in forms}
    xs = x.numpy()
    for cm in forms.values():
        cm.run(xs)  # warm up (session creation)
    for _ in range(args.runs):
        for name, cm in forms.items():
            t = time.perf_counter()
            cm.run(xs)
            times[name].append(time.perf_counter() - t)
    print(f"shape {shape}, {args.runs} interleaved runs, onert {getattr(__import__('onert'), '__version__', '?')}")
    print(f"{'form':<12} {'ops':>4} {'histogram':<40} {'median ms':>10} {'min ms':>8} {'max |diff|':>11}")
    for name, cm in forms.items():
        hist = dict(cm.op_histogram())
        diff = float(np.abs(cm.run(xs)[0] - want).max())
        print(f"{name:<12} {sum(hist.values()):>4} {str(hist):<40} {statistics.median(times[name]) * 1e3:>10.3f} "
              f"{min(times[name]) * 1e3:>8.3f} {diff:>11.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
