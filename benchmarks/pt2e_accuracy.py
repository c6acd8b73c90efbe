"""Static (PT2E) quantization accuracy on a real trained checkpoint: SmolLM2-135M-Instruct.

    python benchmarks/pt2e_accuracy.py                  # 512 tokens, every variant, onert for the default
    python benchmarks/pt2e_accuracy.py --tokens 256 --no-onert

Evaluation text: 512 tokens of ``pydoc_data.topics["execmodel"]``; calibration: the four other
topics of ``tests/checkpoint.py`` (never the evaluation text). Each row is one
``CircleQuantizer`` configuration: perplexity and top-1 agreement with float eager of the
fake-quantized torch model (``convert_pt2e``); for the rows marked ``onert`` the same model is
exported with ``quant_target="onert"`` and run in onert, and its top-1 agreement with the
fake-quant reference is reported too (the file must compute what the reference computes).
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

#: (label, CircleQuantizer keyword arguments, run in onert too)
VARIANTS = [
    ("all-integer (quantize_elementwise, skip=())", dict(quantize_elementwise=True, skip=()), False),
    ("linears only, skip=(), minmax", dict(skip=()), True),
    ("default: minmax, skip down_proj", dict(), True),
    ("percentile, skip down_proj", dict(activation_observer="percentile"), False),
    ("mse (histogram), skip down_proj", dict(activation_observer="mse"), False),
    ("per-channel weights, skip down_proj", dict(per_channel_weights=True), True),
    ("per-channel weights, float linear outputs, skip down_proj",
     dict(per_channel_weights=True, linear_outputs="float"), True),
    ("SmoothQuant alpha 0.5, skip down_proj", dict(smooth_quant=0.5), True),
    ("SmoothQuant alpha 0.5 norm+up folds only, skip down_proj",
     dict(smooth_quant=0.5, smooth_kinds=("rms_norm", "up_proj")), True),
    ("SmoothQuant alpha 0.8, skip down_proj", dict(smooth_quant=0.8), True),
    ("SmoothQuant alpha 0.5, skip=()", dict(smooth_quant=0.5, skip=()), True),
    ("SmoothQuant alpha 0.5 norm+up folds only, skip=()",
     dict(smooth_quant=0.5, smooth_kinds=("rms_norm", "up_proj"), skip=()), True),
    ("SmoothQuant alpha 0.8, skip=()", dict(smooth_quant=0.8, skip=()), True),
]


def quantize(gm, calibration, **kwargs):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    import torch

    from circle_fx.quant import CircleQuantizer

    if "smooth_quant" in kwargs or kwargs.get("gptq"):  # SmoothQuant's maxima / GPTQ's Hessians: the same calibration
        kwargs = dict(kwargs, calibration=[(ids,) for ids in calibration])
    prepared = prepare_pt2e(copy.deepcopy(gm), CircleQuantizer(**kwargs))
    with torch.no_grad():
        for ids in calibration:
            prepared(ids)
    return convert_pt2e(prepared)


def setup(tokens: int):
    """The checkpoint as a PT2E benchmark starts from it: evaluation ids (``tokens`` of
    execmodel), calibration batches, the float eager logits and the exported module; prints
    the table's heading line."""
    import torch

    import checkpoint as ck

    model = ck.logits_model()
    ev, cal = ck.eval_ids(tokens), ck.calibration_ids(tokens)
    with torch.no_grad():
        ref = model(ev)
    gm = torch.export.export(model, (ev,), strict=False).module()
    print(f"SmolLM2-135M-Instruct, {tokens} tokens of execmodel, calibration {len(cal)} x {tokens} tokens")
    print()
    return ev, cal, ref, gm


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--no-onert", action="store_true", help="fake-quant rows only")
    ap.add_argument("--only", nargs="*", default=None, help="run only variants whose label contains one of these")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch

    import checkpoint as ck
    import circle_fx

    ev, cal, ref, gm = setup(args.tokens)
    print("| variant | ppl (fake-quant torch) | top-1 vs float | ppl in onert | onert top-1 vs fake-quant | time |")
    print("|---|---|---|---|---|---|")
    print(f"| float32 eager | {ck.perplexity(ref, ev):.2f} | 1.000 | | | |", flush=True)
    for label, kwargs, onert in VARIANTS:
        if args.only and not any(o in label for o in args.only):
            continue
        t = time.perf_counter()
        q = quantize(gm, cal, **kwargs)
        with torch.no_grad():
            fq = q(ev)
        cells = [f"{ck.perplexity(fq, ev):.2f}", f"{ck.top1_agreement(fq.numpy(), ref.numpy()):.3f}", "", ""]
        if onert and not args.no_onert:
            cm = circle_fx.export(q, (ev,), quant_target="onert")
            (logits,) = cm.run(ev.numpy())
            cells[2:] = [f"{ck.perplexity(logits, ev):.2f}", f"{ck.top1_agreement(logits, fq.numpy()):.3f}"]
        print(f"| {label} | {' | '.join(cells)} | {time.perf_counter() - t:.0f} s |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
