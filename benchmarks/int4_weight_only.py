"""4-bit weights alone (float activations, eager) on SmolLM2-135M-Instruct: which rounding and
which scale granularity, before any file is written.

    python benchmarks/int4_weight_only.py --modes rtn,gptq,gptq64,gptq32
    python benchmarks/int4_weight_only.py --rotate --modes gptq,gptq64

Every ``nn.Linear`` but ``lm_head`` is rounded onto a symmetric [-8, 7] grid, one scale per
output row (``rtn`` / ``gptq``) or per group of N input columns (``gptqN``; Circle's per-channel
quantization cannot hold those: they would need its BlockwiseQuantization table), with the scale
search of ``circle_fx.quant.gptq.symmetric_grid``; ``gptq*`` by ``circle_fx.quant.gptq.gptq``
(act order, static groups) over Hessians from forward pre-hooks on the calibration topics.
``--rotate``: ``circle_fx.quant.rotation.rotate_residual`` first. Evaluation: ``--tokens`` of
``pydoc_data.topics["execmodel"]``; calibration: the four other topics of ``tests/checkpoint.py``.
What the npu file (int16 activations) then costs on top is ``npu_int16_accuracy.py``'s table.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--modes", default="rtn,gptq,gptq64,gptq32")
    ap.add_argument("--rotate", action="store_true")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch

    import checkpoint as ck
    from circle_fx.quant.gptq import Hessian, gptq, symmetric_grid
    from circle_fx.quant.rotation import rotate_residual

    model = copy.deepcopy(ck.logits_model())
    ev, cal = ck.eval_ids(args.tokens), ck.calibration_ids(args.tokens)
    with torch.no_grad():
        ref = model(ev)
        if args.rotate:
            rotate_residual(model)
    lins = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in n}
    orig = {n: m.weight.detach().clone() for n, m in lins.items()}
    hs = {n: Hessian(m.in_features) for n, m in lins.items()}
    hooks = [m.register_forward_pre_hook(lambda mod, a, n=n: hs[n].add(a[0])) for n, m in lins.items()]
    with torch.no_grad():
        for ids in cal:
            model(ids)
    for h in hooks:
        h.remove()

    def rtn(w, _h):
        grid, _ = symmetric_grid(-8, 7)
        rnd = grid(w)
        return torch.stack([rnd(c, k) for k, c in enumerate(w.T)], 1)

    print(f"SmolLM2-135M-Instruct, {args.tokens} tokens of execmodel, rotate={args.rotate}; float32 "
          f"{ck.perplexity(ref, ev):.2f}\n")
    print("| rounding | scales | perplexity | top-1 vs float | time |\n|---|---|---|---|---|")
    for mode in args.modes.split(","):
        group = int(mode[4:]) if mode.startswith("gptq") and mode[4:] else None
        fn = rtn if mode == "rtn" else (lambda w, h, g=group: gptq(w, h.h, symmetric_grid(-8, 7)[0], group=g))
        t = time.perf_counter()
        with torch.no_grad():
            for n, m in lins.items():
                m.weight.copy_(fn(orig[n], hs[n]))
            out = model(ev)
        print(f"| {'gptq' if mode != 'rtn' else 'nearest'} | {'per row' if group is None else f'per {group} columns'} "
              f"| {ck.perplexity(out, ev):.2f} | {ck.top1_agreement(out.numpy(), ref.numpy()):.3f} "
              f"| {time.perf_counter() - t:.0f} s |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
