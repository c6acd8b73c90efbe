"""Why q8_0's greedy tokens leave float's on quant_accuracy.py's prompt: teacher-forced margins.

    python benchmarks/greedy_margins.py                       # the table below, every config
    python benchmarks/greedy_margins.py "q8_0" "emb+head float"

SmolLM2-135M-Instruct, the chat prompt of ``quant_accuracy.py``, the float model's 32 greedy
tokens. One forward of prompt + those tokens (teacher forcing) gives, for a quantized model, the
same count of leading equal tokens as its own greedy generation would (the first step where its
argmax differs is where generation would leave float's), in one onert run instead of 32.

Per config: **lead graph** / **lead onert**: leading tokens equal to float's, for the exported graph
in eager PyTorch (the file's weights, float activations) and for the file in onert (ggml also
quantizes activations per 32-block); at onert's divergence step, the float model's top-1/top-2
margin; **|d margin|**: the median change of the float top-1 minus top-2 logit over the 32 steps
(the quantization noise on the decision), and the logits' relative L2 error; **P(32 kept)**: the
chance that every one of the 32 float margins survives Gaussian noise of that size (sigma = 1.4826 x
the median |d margin|, the normal distribution's median-to-sigma factor): prod_s Phi(margin_s / sigma).
It says how likely *any* quantized model with this much logit noise is to keep all 32 tokens on
this prompt, where a single run's count is one draw.
"""
from __future__ import annotations

import math
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, HERE)

N = 32


def configs():
    from circle_fx import QuantConfig

    def q8(**kw):
        return QuantConfig(**{"weights": "q8_0", "embedding": "uint8-rows", **kw})

    def layers(rng):
        return tuple((f"model.layers.{i}.*", None) for i in rng)

    return {
        "float32": None,
        "q8_0": "q8_0",
        # int8 rows in every linear, as measured before QuantConfig.blocks_from_rows (the preset now stores
        # linears of >= 16 rows, this whole-prompt forward's, as Q8_0 blocks: the q8_0 row)
        "int8-weights": QuantConfig(blocks_from_rows=None),
        # tied table: keeping either use float keeps both float
        "emb+head float": q8(embedding=None, lm_head=None),
        "layers 0-14 float": q8(overrides=layers(range(15))),
        "layers 15-29 float": q8(overrides=layers(range(15, 30))),
    }


def main(argv=None) -> int:
    import numpy as np
    import torch

    import checkpoint
    import circle_fx
    from quant_accuracy import PROMPT, print_table

    warnings.filterwarnings("ignore")
    if not checkpoint.available():
        print(checkpoint.SKIP_REASON)
        return 1
    table = configs()
    names = (argv if argv is not None else sys.argv[1:]) or list(table)
    model, tok = checkpoint.load_model(), checkpoint.load_tokenizer()
    p = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True)
    p = p if isinstance(p, list) else list(p["input_ids"])
    with torch.no_grad():
        ft = model.generate(torch.tensor([p]), max_new_tokens=N, do_sample=False)[0, len(p):].tolist()
        seq = torch.tensor([p + ft])
        ref = model(seq, use_cache=False).logits[0].numpy()
    P, steps = len(p), np.arange(N)
    gen = ref[P - 1:P - 1 + N]
    order = np.argsort(gen, -1)
    second = order[:, -2]
    margins = gen[steps, ft] - gen[steps, second]
    print(f"float top-1 - top-2 margin per step: {' '.join(f'{m:.3f}' for m in margins)}")

    def lead(lg):
        bad = np.nonzero(lg[P - 1:P - 1 + N].argmax(-1) != np.array(ft))[0]
        return int(bad[0]) if len(bad) else N

    def noise(lg):
        g = lg[P - 1:P - 1 + N]
        d = (g[steps, ft] - g[steps, second]) - margins
        return float(np.median(np.abs(d))), float(np.linalg.norm(g - gen) / np.linalg.norm(gen))

    def kept(d):
        """P(all 32 margins keep their sign) under Gaussian noise of median |d| = d."""
        if d == 0:
            return 1.0
        sigma = 1.4826 * d
        return float(np.prod([0.5 * (1 + math.erf(m / (sigma * math.sqrt(2)))) for m in margins]))

    rows = []
    for name in names:
        t = time.perf_counter()
        program = circle_fx.capture(model, (seq,), example_kwargs={"use_cache": False})
        cm = circle_fx.api.lower(program, quantize=table[name])
        with torch.no_grad():
            g = np.asarray(program.run(seq)[0][0])
        o = np.asarray(cm.run(seq)[0][0])
        k = lead(o)
        d, rel = noise(o)
        rows.append([name, f"{cm.size / 1e6:.1f}", f"{lead(g)}/{N}", f"{k}/{N}",
                     f"{margins[k]:.3f}" if k < N else "-", f"{d:.3f}", f"{rel:.4f}", f"{100 * kept(d):.1f}%"])
        print("  done:", rows[-1], f"{time.perf_counter() - t:.0f} s", flush=True)
        del cm, program
    cols = ["config", "file MB", "lead graph", "lead onert", "float margin there", "|d margin| onert", "rel L2 onert", "P(32 kept)"]
    print_table(cols, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
