"""SiLU in onert: LOGISTIC + MUL vs the TANH form ``h + h * tanh(h)``, ``h = x / 2``.

``silu(x) = x * sigmoid(x) = x/2 * (1 + tanh(x/2))``: the same function, two Circle spellings.
The TANH form is MUL, TANH, MUL, ADD (four kernels, one more pass over the data each) against
LOGISTIC, MUL; FACTS.md recorded it once as 27% faster. Each form is exported from a module that
writes it out (the pipeline keeps both as written: ``fuse_silu`` is removed for the LOGISTIC one),
then timed in onert (median of ``--runs`` interleaved calls) and compared with eager.

    python benchmarks/silu_forms.py                      # [1, 128, 1536]: a SmolLM2-size MLP, 128 tokens
    python benchmarks/silu_forms.py --shape 1,56,56,64   # a CNN feature map
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import circle_fx  # noqa: E402


class Logistic(torch.nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class TanhForm(torch.nn.Module):
    def forward(self, x):
        h = x * 0.5
        return h + h * torch.tanh(h)


def _pipeline():
    p = circle_fx.default_pipeline()
    return p.remove_pass("fuse_silu") if "fuse_silu" in p.names() else p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1,128,1536")
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args(argv)
    shape = [int(s) for s in args.shape.split(",")]
    x = torch.randn(*shape) * 3
    want = torch.nn.functional.silu(x).numpy()
    forms = {"LOGISTIC+MUL": circle_fx.export(Logistic(), (x,), passes=_pipeline()),
             "TANH form": circle_fx.export(TanhForm(), (x,), passes=_pipeline())}
    xs = x.numpy()
    times = {k: [] for k in forms}
    for cm in forms.values():
        cm.run(xs)
    for _ in range(args.runs):
        for name, cm in forms.items():
            t = time.perf_counter()
            cm.run(xs)
            times[name].append(time.perf_counter() - t)
    print(f"shape {shape}, {args.runs} interleaved runs")
    print(f"{'form':<14} {'histogram':<44} {'median ms':>10} {'min ms':>8} {'max |diff|':>11}")
    for name, cm in forms.items():
        diff = float(np.abs(cm.run(xs)[0] - want).max())
        print(f"{name:<14} {str(dict(cm.op_histogram())):<44} {statistics.median(times[name]) * 1e3:>10.3f} "
              f"{min(times[name]) * 1e3:>8.3f} {diff:>11.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
