"""int16-activation NPU files (``CircleQuantizer(activation_dtype="int16")``, ``quant_target="npu"``)
on a real trained checkpoint: SmolLM2-135M-Instruct.

    python benchmarks/npu_int16_accuracy.py                 # 128 tokens
    python benchmarks/npu_int16_accuracy.py --tokens 512

onert 0.1.0 runs no int16 kernel, so the file is evaluated by the numpy reference of its
operators (``circle_fx.circle.reference``: each integer op from the file's own integers and
parameters). Evaluation text: ``--tokens`` tokens of ``pydoc_data.topics["execmodel"]``;
calibration: the four other topics of ``tests/checkpoint.py``. Per variant: perplexity and
top-1 agreement with float eager of the fake-quantized torch model (``convert_pt2e``) and of
the file's reference, and the top-1 agreement of the file with the fake-quant model.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

#: (label, CircleQuantizer keyword arguments)
VARIANTS = [
    ("int16 act. / int8 per-row weights, all integer (default)", dict(activation_dtype="int16")),
    ("int16 act. / int8 per-tensor weights", dict(activation_dtype="int16", per_channel_weights=False)),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--only", default=None, help="run only variants whose label contains this")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch

    import checkpoint as ck
    import circle_fx
    from circle_fx.circle import reference
    from pt2e_accuracy import quantize, setup

    ev, cal, ref, gm = setup(args.tokens)
    print("| variant | ppl fake-quant torch | top-1 vs float | ppl file (numpy reference) | top-1 vs float "
          "| file top-1 vs fake-quant | time |")
    print("|---|---|---|---|---|---|---|")
    print(f"| float32 eager | {ck.perplexity(ref, ev):.2f} | 1.000 | | | | |", flush=True)
    for label, kwargs in VARIANTS:
        if args.only and args.only not in label:
            continue
        t = time.perf_counter()
        q = quantize(gm, cal, **kwargs)
        with torch.no_grad():
            fq = q(ev)
        cm = circle_fx.export(q, (ev,), quant_target="npu")
        (logits,) = reference.run(cm.to_bytes(), [ev.numpy()])
        hist = cm.op_histogram()
        cells = [f"{ck.perplexity(fq, ev):.2f}", f"{ck.top1_agreement(fq.numpy(), ref.numpy()):.3f}",
                 f"{ck.perplexity(logits, ev):.2f}", f"{ck.top1_agreement(logits, ref.numpy()):.3f}",
                 f"{ck.top1_agreement(logits, fq.numpy()):.3f}"]
        print(f"| {label} | {' | '.join(cells)} | {time.perf_counter() - t:.0f} s |", flush=True)
        print(f"  file: {hist.get('RMS_NORM', 0)} RMS_NORM, {hist.get('FULLY_CONNECTED', 0)} FULLY_CONNECTED, "
              f"{len(cm.report.notes)} note(s)" + "".join(f"\n  note: {n}" for n in cm.report.notes), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
