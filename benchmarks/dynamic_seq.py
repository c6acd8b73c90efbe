"""One dynamic-length Circle model against one static model per length, in onert.

    python benchmarks/dynamic_seq.py                  # defaults below
    python benchmarks/dynamic_seq.py --lengths 8 64 256 --max 256 --runs 30

Model: ``LlamaForCausalLM(LlamaConfig(vocab 4096, hidden 256, intermediate 768, 4 layers,
8 heads, 4 KV heads))``, random weights (seed 0), ``use_cache=False``.

The dynamic model (``Dim("seq", max=--max)``, only ``input_ids``) builds positions and the
causal mask on device from prefix sums (emit/lowerings/scan.py) and runs RMSNorm
decomposed (onert's RMS_NORM cannot resize); a static model folds both to constants and
fuses RMS_NORM. The two are timed interleaved (A, B, A, B, ...) so background load hits
both alike; the table gives medians, the ratio, operator counts, and the largest logit
difference of each against eager PyTorch.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import transformers
from torch.export import Dim

import circle_fx


def build():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096)
    return transformers.LlamaForCausalLM(cfg).eval()


def median_ms(cm, x, runs):
    cm.run(x)  # warm-up (session creation, first resize)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        cm.run(x)
        times.append((time.perf_counter() - t) * 1e3)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--max", type=int, default=256)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    model = build()
    kw = {"use_cache": False}
    ids = torch.randint(0, 4096, (1, 8), generator=torch.Generator().manual_seed(1))
    dyn = circle_fx.export(model, (ids,), example_kwargs=kw,
                           dynamic_shapes={"input_ids": {1: Dim("seq", max=args.max)}, "use_cache": None})
    print(f"dynamic model: {len(dyn.builder.operators)} operators, max length {args.max}")
    print(f"| length | static ms | dynamic ms | dynamic/static | static ops | dynamic ops | max diff static | max diff dynamic |")
    print("|---|---|---|---|---|---|---|---|")
    for n in args.lengths:
        x = torch.randint(0, 4096, (1, n), generator=torch.Generator().manual_seed(n))
        static = circle_fx.export(model, (x,), example_kwargs=kw)
        with torch.no_grad():
            want = model(input_ids=x, use_cache=False).logits.numpy()
        d_static = float(np.abs(static.run(x)[0] - want).max())
        d_dyn = float(np.abs(dyn.run(x)[0] - want).max())
        s_times, d_times = [], []
        for _ in range(args.runs):  # interleaved
            s_times += median_ms(static, x, 1)
            d_times += median_ms(dyn, x, 1)
        s, d = statistics.median(s_times), statistics.median(d_times)
        print(f"| {n} | {s:.2f} | {d:.2f} | {d / s:.2f} | {len(static.builder.operators)} | "
              f"{len(dyn.builder.operators)} | {d_static:.1e} | {d_dyn:.1e} |")


if __name__ == "__main__":
    main()
