"""What a uint8 KV cache would cost in perplexity (issue 32 item 6), SmolLM2-135M-Instruct, eager.

    python benchmarks/kv_uint8_accuracy.py [--tokens 2048]

The onert side is probed in docs/probes/uint8_kv_cache.py (docs/onert-findings.md: onert 0.1.0 stores a
uint8 cache and dequantizes it in the graph, but has no BATCH_MATMUL on it). This measures the other half:
the perplexity of the first ``--tokens`` tokens of the joined pydoc topics when every cached K/V row is
rounded to uint8 with one scale and zero point per token and head (ONE's runner's ``KVCacheDataType``
UINT8 granularity is not documented per token; ExecuTorch's int8 cache is per token), and with int8
symmetric per token. The rounding is applied to every row the attention reads, the current token's own
row included (a decode step would use its own row in float: this is slightly pessimistic). One forward
of the whole text through the model's own ``forward`` with a ``DynamicCache`` subclass whose
``update`` rounds what it stores: no patching.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))


def _round_uint8(x):
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    scale = ((hi - lo) / 255).clamp(min=1e-12)
    zp = (-lo / scale).round().clamp(0, 255)
    return ((x / scale + zp).round().clamp(0, 255) - zp) * scale


def _round_int8(x):
    scale = (x.abs().amax(-1, keepdim=True) / 127).clamp(min=1e-12)
    return (x / scale).round().clamp(-127, 127) * scale


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=2048)
    args = p.parse_args(argv)
    import pydoc_data.topics as topics
    import torch
    from transformers import DynamicCache

    import checkpoint

    model, tok = checkpoint.load_model(), checkpoint.load_tokenizer()
    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    ids = tok(text, return_tensors="pt").input_ids[:, :args.tokens]

    def ppl(rounder):
        class Rounded(DynamicCache):
            def update(self, key_states, value_states, layer_idx, *a, **k):
                if rounder is not None:
                    key_states, value_states = rounder(key_states), rounder(value_states)
                return super().update(key_states, value_states, layer_idx, *a, **k)

        with torch.no_grad():
            logits = model(ids, past_key_values=Rounded(config=model.config), use_cache=True).logits[0, :-1]
        nll = torch.nn.functional.cross_entropy(logits.double(), ids[0, 1:])
        return math.exp(float(nll))

    base = ppl(None)
    print(f"SmolLM2-135M-Instruct, {ids.shape[1]} tokens of the pydoc topics, eager; load "
          f"{' '.join(open('/proc/loadavg').read().split()[:3])}")
    print()
    print("| KV cache | bytes / element | perplexity | vs float32 |")
    print("|---|---|---|---|")
    print(f"| float32 | 4 | {base:.4f} | |")
    for name, r, b in (("uint8, scale + zero point per token and head", _round_uint8, "1 (+8 per 64)"),
                       ("int8 symmetric, scale per token and head", _round_int8, "1 (+4 per 64)")):
        v = ppl(r)
        print(f"| {name} | {b} | {v:.4f} | {100 * (v / base - 1):+.2f} % |")


if __name__ == "__main__":
    main()
