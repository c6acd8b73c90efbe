"""Per-layer sensitivity on SmolLM2-135M: leave the k linears with the lowest SQNR float.

    python benchmarks/pt2e_sensitivity.py --tokens 128 --ks 0 8 16 32
    python benchmarks/pt2e_sensitivity.py --scheme per-channel-float-out --ks 0 4

The ranking is ``circle_fx.quant.report.quantization_report`` of the calibrated (prepared)
model on the first calibration batch: per linear, the SQNR of its fake-quantized input,
weight (and output) against float. For each k the scheme is re-prepared with the k worst
linears added to ``skip`` (input, weight and output float), calibrated on the same batches,
converted, run as fake-quant torch and exported with ``quant_target="onert"`` and run in
onert. Prints perplexity and top-1 agreements per k (issue 18 item 3: onert vs fake-quant
>= 0.98, perplexity within 15 % of float).
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    from pt2e_localize import SCHEMES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--layers", type=int, default=None, help="cut the model to its first N decoder layers")
    ap.add_argument("--scheme", choices=sorted(SCHEMES), default="per-channel")
    ap.add_argument("--ks", type=int, nargs="+", default=[0, 8, 16, 32])
    ap.add_argument("--no-onert", action="store_true")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    import checkpoint as ck
    import circle_fx
    from circle_fx.quant import CircleQuantizer
    from circle_fx.quant.pt2e import DEFAULT_SKIP
    from circle_fx.quant.report import quantization_report

    model = ck.logits_model()
    layers = model.model.model.layers
    try:
        if args.layers:
            model.model.model.layers = layers[:args.layers]
        ev, cal = ck.eval_ids(args.tokens), ck.calibration_ids(args.tokens)
        with torch.no_grad():
            ref = model(ev)
        gm = torch.export.export(model, (ev,), strict=False).module()
    finally:
        model.model.model.layers = layers
    options = SCHEMES[args.scheme]
    prepared = prepare_pt2e(copy.deepcopy(gm), CircleQuantizer(**options))
    with torch.no_grad():
        for ids in cal:
            prepared(ids)
    ranking = sorted(quantization_report(prepared, cal[:1]).layers, key=lambda e: e.sqnr_db)
    print(f"SmolLM2-135M, {args.layers or len(layers)} layers, {args.tokens} tokens, scheme {args.scheme} {options}; "
          f"float ppl {ck.perplexity(ref, ev):.2f}")
    print("worst linears (SQNR dB): " + ", ".join(f"{e.name.replace('model.model.', '')} {e.sqnr_db:.1f}"
                                                  for e in ranking[:max(args.ks)]))
    print()
    print("| k float | ppl fake-quant | top-1 fake-quant vs float | ppl onert | top-1 onert vs float "
          "| top-1 onert vs fake-quant | time |")
    print("|---|---|---|---|---|---|---|")
    for k in args.ks:
        t = time.perf_counter()
        skip = tuple(options.get("skip", DEFAULT_SKIP)) + tuple(e.name for e in ranking[:k])
        p = prepare_pt2e(copy.deepcopy(gm), CircleQuantizer(**dict(options, skip=skip)))
        with torch.no_grad():
            for ids in cal:
                p(ids)
            q = convert_pt2e(p)
            fq = q(ev).numpy()
        cells = [f"{ck.perplexity(fq, ev):.2f}", f"{ck.top1_agreement(fq, ref.numpy()):.3f}", "", "", ""]
        if not args.no_onert:
            (logits,) = circle_fx.export(q, (ev,), quant_target="onert").run(ev.numpy())
            cells[2:] = [f"{ck.perplexity(logits, ev):.2f}", f"{ck.top1_agreement(logits, ref.numpy()):.3f}",
                         f"{ck.top1_agreement(logits, fq):.3f}"]
        print(f"| {k} | {' | '.join(cells)} | {time.perf_counter() - t:.0f} s |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
