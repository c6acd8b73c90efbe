"""Cost of the default GATHER index clamp (export(clamp_indices=True)): a 4-layer Llama
(hidden 256, vocab 32000) run in onert with and without it, 1 and 128 ids; median of runs."""
from __future__ import annotations

import time

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import circle_fx


def median_ms(cm, ids, runs):
    cm.run(ids)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        cm.run(ids)
        times.append(time.perf_counter() - t)
    return 1000 * float(np.median(times))


def main():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    model = LlamaForCausalLM(cfg).eval()
    print(f"{'ids':>5} {'clamp ms':>9} {'no clamp ms':>12} {'extra ops':>10}")
    for n, runs in ((1, 200), (128, 30)):
        ids = torch.randint(0, 32000, (1, n), dtype=torch.int32)
        on = circle_fx.export(model, (ids,), verbose=False)
        off = circle_fx.export(model, (ids,), verbose=False, clamp_indices=False)
        extra = len(on.builder.operators) - len(off.builder.operators)
        print(f"{n:>5} {median_ms(on, ids, runs):>9.3f} {median_ms(off, ids, runs):>12.3f} {extra:>10}")


if __name__ == "__main__":
    main()
