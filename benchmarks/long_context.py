"""Long text on the real checkpoint (issue 32 item 5): SmolLM2-135M-Instruct (context 8,192) exported
float32 with ``max_seq_len=4096`` (prefill 512, buckets "auto"), run in onert, against transformers eager.

    python benchmarks/long_context.py [--tokens 4096] [--prompt 3000] [--new 64] [--reuse DIR]

Text: the pydoc topics (``pydoc_data.topics``, sorted by name, joined) tokenized with the package's own
tokenizer.json, first ``--tokens`` ids. One process, one package, in this order:

1. **generate after a long prompt**: the first ``--prompt`` ids as the prompt (the runner prefills 512,
   then feeds the rest as decode steps: prefill starts at position 0 only), ``--new`` greedy tokens,
   against ``model.generate(do_sample=False)`` with the same prompt.
2. **the whole window**: the same session's cache rows 0..prompt-1 hold the text; the text's ids from
   ``prompt`` on are fed as decode steps, overwriting the generated rows (rows past a step's position
   are masked), up to position ``tokens - 1``. The logits of every position from 511 (the prefill's)
   to ``tokens - 1`` are compared with one eager forward of the whole text: max |diff|, top-1
   agreement, and the perplexity of the next token under each (positions 511..tokens-2).

Decode steps cross the 256 / 1024 / 4096 cache-length buckets, so every bucket is exercised.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def _text_ids(runner, n: int) -> list[int]:
    import pydoc_data.topics as topics

    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    ids = runner.encode(text)
    if len(ids) < n:
        raise SystemExit(f"the pydoc topics give {len(ids)} tokens, fewer than --tokens {n}")
    return ids[:n]


def _log_softmax(row):
    import numpy as np

    row = row.astype(np.float64)
    m = row.max()
    return row - m - math.log(np.exp(row - m).sum())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--prompt", type=int, default=3000)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--reuse", help="a package directory exported before (same settings)")
    args = p.parse_args(argv)
    import numpy as np
    import torch

    import checkpoint
    import circle_fx
    from circle_fx.llm.runner import LLMRunner

    model = checkpoint.load_model()
    load = open("/proc/loadavg").read().split()[:3]
    pkg = args.reuse or tempfile.mkdtemp(prefix="long_ctx_")
    t0 = time.perf_counter()
    if not args.reuse:
        circle_fx.export_llm(model, max_seq_len=args.tokens, prefill_len=512,
                             tokenizer=checkpoint.load_tokenizer()).save(pkg)
    export_s = time.perf_counter() - t0
    runner = LLMRunner(pkg)
    ids = _text_ids(runner, args.tokens)

    # 1. generate after the long prompt
    prompt = ids[:args.prompt]
    t0 = time.perf_counter()
    out, seen = runner.generate(prompt, args.new, eos_token_ids=[], return_logits=True)
    onert_s = time.perf_counter() - t0
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=args.new, do_sample=False,
                             eos_token_id=None, pad_token_id=0)[0].tolist()
    new, ref_new = out[len(prompt):], ref[len(prompt):]
    first = next((i for i, (a, b) in enumerate(zip(new, ref_new)) if a != b), None)

    # 2. the whole window: logits 511..tokens-1
    logits = {}
    t1 = time.perf_counter()
    runner.reset()
    logits[511] = runner.run_prefill(ids[:512]).copy()
    for pos in range(512, args.tokens):
        logits[pos] = runner.step(ids[pos], pos).copy()
    window_s = time.perf_counter() - t1
    with torch.no_grad():
        eager = model(torch.tensor([ids])).logits[0].numpy()
    diffs = [float(np.abs(logits[q] - eager[q]).max()) for q in sorted(logits)]
    top1 = np.mean([int(logits[q].argmax() == eager[q].argmax()) for q in sorted(logits)])
    nll_o = [-_log_softmax(logits[q])[ids[q + 1]] for q in sorted(logits) if q + 1 < args.tokens]
    nll_e = [-_log_softmax(eager[q])[ids[q + 1]] for q in sorted(logits) if q + 1 < args.tokens]
    worst = sorted(logits)[int(np.argmax(diffs))]

    print(f"SmolLM2-135M-Instruct float32, max_seq_len {args.tokens}, prefill 512; load {' '.join(load)}; "
          f"export {export_s:.0f} s")
    print()
    print("| check | onert | transformers eager | |")
    print("|---|---|---|---|")
    print(f"| {args.new} greedy tokens after a {args.prompt}-token prompt | "
          f"{'= transformers' if first is None else f'first differs at new token {first}'} | "
          f"model.generate | onert {onert_s:.0f} s |")
    print(f"| perplexity, positions 511..{args.tokens - 2} ({len(nll_o)} tokens) | {math.exp(np.mean(nll_o)):.4f} | "
          f"{math.exp(np.mean(nll_e)):.4f} | |")
    print(f"| max abs logit diff over {len(diffs)} positions | {max(diffs):.2e} (at position {worst}) | | "
          f"median {float(np.median(diffs)):.2e} |")
    print(f"| top-1 agreement | {top1:.4f} | | window {window_s:.0f} s |")
    for lo, hi in ((511, 1023), (1024, 2047), (2048, 3071), (3072, args.tokens - 1)):
        part = [d for q, d in zip(sorted(logits), diffs) if lo <= q <= hi]
        if part:
            print(f"| max abs logit diff, positions {lo}..{hi} | {max(part):.2e} | | |")
    return 0 if first is None else 1


if __name__ == "__main__":
    sys.exit(main())
