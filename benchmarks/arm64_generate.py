"""Greedy generation with SmolLM2-135M (the real checkpoint, tests/checkpoint.py) on onert's aarch64 build
under qemu-user, beside x86 onert and transformers: the package runner (``LLMRunner``, here with
``runtime=Arm64Runtime()``) drives the same package on both.

    PYTHONPATH=$PWD python scripts/arm64.py setup                      # once
    PYTHONPATH=$PWD python benchmarks/arm64_generate.py [--new 8] [--modes float q8_0 q4_0]

Per weight mode: the new tokens on arm64, on x86 and in transformers (``model.generate``, greedy),
the first new token where arm64 differs from x86 (and from transformers), and the largest
|arm64 - x86| over the logits each token was picked from. Float must equal transformers'
tokens; a quantized package x86's tokens, else the first divergence is stated.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "scripts"))
sys.path.insert(0, os.path.dirname(HERE))

PROMPT = "The Python interpreter executes code"


def first_difference(a: list[int], b: list[int]):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--modes", nargs="*", default=["float", "q8_0", "q4_0"])
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import numpy as np

    import checkpoint as ck
    import circle_fx
    import circle_fx.llm
    import greedy_reference as gr
    from circle_fx.circle.arm64 import Arm64Runtime

    model, tok = ck.load_model(), ck.load_tokenizer()
    model.config.use_cache = model.generation_config.use_cache = True
    ids = tok(PROMPT)["input_ids"]
    hf, _ = gr.hf_greedy(model, ids, args.new, eos=[])
    hf = hf[len(ids):]
    print(f"SmolLM2-135M-Instruct, prompt {PROMPT!r} ({len(ids)} tokens), {args.new} greedy new tokens")
    print(f"transformers: {hf} {tok.decode(hf)!r}\n")
    print("| mode | arm64 tokens | x86 tokens | arm64 = x86 | arm64 = transformers | max |arm64 - x86| logits (same context) | "
          "arm64 s/token | text (arm64) |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in args.modes:
        d = tempfile.mkdtemp(prefix=f"circle_fx_smollm2_{mode}_")
        pkg = circle_fx.export_llm(model, max_seq_len=len(ids) + args.new + 1, prefill_len=len(ids),
                                   quantize=None if mode == "float" else mode, tokenizer=None)
        pkg.save(d)
        del pkg
        gc.collect()
        out = {}
        for where in ("x86", "arm64"):
            rt = Arm64Runtime() if where == "arm64" else None
            runner = circle_fx.llm.LLMRunner(d, runtime=rt)
            t = time.time()
            toks, logits = runner.generate(ids, args.new, eos_token_ids=[], return_logits=True, use_prefill=True)
            out[where] = (toks[len(ids):], np.stack(logits), (time.time() - t) / args.new)
            del runner
            if rt is not None:
                rt.close()
            gc.collect()
        a, x = out["arm64"], out["x86"]
        dx, dh = first_difference(a[0], x[0]), first_difference(a[0], hf)
        same = lambda d: "yes" if d is None else f"no, from new token {d}"  # noqa: E731
        # logits compared while both saw the same tokens: up to and including the first divergence
        upto = len(a[0]) if dx is None else dx + 1
        diff = float(np.abs(a[1][:upto] - x[1][:upto]).max())
        margin = ""
        if dx is not None:  # how close x86's choice was: its top-1 minus its top-2 logit at that step
            top2 = np.sort(x[1][dx])[-2:]
            margin = f"; x86's top-2 margin there {float(top2[1] - top2[0]):.3g}"
        print(f"| {mode} | {a[0]} | {x[0]} | {same(dx)}{margin} | {same(dh)} | {diff:.3g} | "
              f"{a[2]:.1f} | {tok.decode(a[0])!r} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
