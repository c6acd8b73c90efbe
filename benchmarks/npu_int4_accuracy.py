"""4-bit weights on the npu target (``CircleQuantizer(activation_dtype="int16", weight_bits=4)``)
on a real trained checkpoint: SmolLM2-135M-Instruct.

    python benchmarks/npu_int4_accuracy.py                   # 512 tokens, every variant
    python benchmarks/npu_int4_accuracy.py --tokens 128 --only gptq

The files hold int16 activations, integer RMS_NORMs and FULLY_CONNECTEDs int16 x INT4 (two
weights per byte, one scale per output row; the lm_head, tied to the embedding, keeps int8:
``keep_8bit``). onert 0.1.0 rejects INT4, so each file is evaluated by the numpy reference of its
operators (``circle_fx.circle.reference``, from the file's own integers). Evaluation text:
``--tokens`` tokens of ``pydoc_data.topics["execmodel"]``; calibration (activation ranges and the
GPTQ Hessians): the four other topics of ``tests/checkpoint.py``. Per variant: perplexity and
top-1 agreement with float eager of the fake-quantized torch model (``convert_pt2e``) and of the
file, the file's top-1 agreement with its fake-quant model, and the mean weight bits of the linears.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

#: (label, CircleQuantizer keyword arguments; "calibration" is filled in)
VARIANTS = [
    ("int8 per-row weights (today's npu default)", dict(activation_dtype="int16")),
    ("int4 per-row, round to nearest", dict(activation_dtype="int16", weight_bits=4)),
    ("int4 per-row, gptq", dict(activation_dtype="int16", weight_bits=4, gptq=True)),
]


def linear_bits(cf) -> float:
    """Mean stored bits per weight of the file's FULLY_CONNECTED weights (each tensor once)."""
    from circle_fx.circle import int4

    seen, bits, n = set(), 0, 0
    for op in cf.operators:
        if op.name == "FULLY_CONNECTED" and op.inputs[1] not in seen:
            seen.add(op.inputs[1])
            t = cf.tensors[op.inputs[1]]
            count = 1
            for d in t.shape:
                count *= d
            bits += count * (4 if int4.is_int4(t.type) else 8 * t.dtype.itemsize)
            n += count
    return bits / max(n, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--only", default=None, help="run only variants whose label contains this")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import torch

    import checkpoint as ck
    import circle_fx
    from circle_fx.circle import reference
    from circle_fx.circle.reader import read_circle
    from pt2e_accuracy import quantize, setup

    ev, cal, ref, gm = setup(args.tokens)
    print("| variant | ppl fake-quant torch | top-1 vs float | ppl file (numpy reference) | top-1 vs float "
          "| file top-1 vs fake-quant | linear weight bits | time |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| float32 eager | {ck.perplexity(ref, ev):.2f} | 1.000 | | | | 32 | |", flush=True)
    for label, kwargs in VARIANTS:
        if args.only and args.only not in label:
            continue
        t = time.perf_counter()
        if kwargs.get("gptq"):
            kwargs = dict(kwargs, calibration=[(ids,) for ids in cal])
        q = quantize(gm, cal, **kwargs)
        with torch.no_grad():
            fq = q(ev)
        cm = circle_fx.export(q, (ev,), quant_target="npu")
        data = cm.to_bytes()
        circle_fx.verify(data)
        (logits,) = reference.run(data, [ev.numpy()])
        cells = [f"{ck.perplexity(fq, ev):.2f}", f"{ck.top1_agreement(fq.numpy(), ref.numpy()):.3f}",
                 f"{ck.perplexity(logits, ev):.2f}", f"{ck.top1_agreement(logits, ref.numpy()):.3f}",
                 f"{ck.top1_agreement(logits, fq.numpy()):.3f}", f"{linear_bits(read_circle(data)):.2f}"]
        print(f"| {label} | {' | '.join(cells)} | {time.perf_counter() - t:.0f} s |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
