"""int16-activation NPU files (``CircleQuantizer(activation_dtype="int16")``, ``quant_target="npu"``)
on a real trained checkpoint: SmolLM2-135M-Instruct.

    python benchmarks/npu_int16_accuracy.py                 # 128 tokens
    python benchmarks/npu_int16_accuracy.py --tokens 512
    python benchmarks/npu_int16_accuracy.py --tokens 512 --only int4      # 4-bit weights (INT4)

onert 0.1.0 runs no int16 kernel, so the file is evaluated by the numpy reference of its
operators (``circle_fx.circle.reference``: each integer op from the file's own integers and
parameters). Evaluation text: ``--tokens`` tokens of ``pydoc_data.topics["execmodel"]``;
calibration: the four other topics of ``tests/checkpoint.py``. Per variant: perplexity and
top-1 agreement with float eager of the fake-quantized torch model (``convert_pt2e``) and of
the file's reference, the top-1 agreement of the file with the fake-quant model, and the mean
stored bits of the linears' weights. The 4-bit variants (``weight_bits=4``: Circle INT4, one
scale per row; the lm_head, tied to the embedding, keeps int8) round to nearest or by GPTQ over
the calibration Hessians (``gptq=True``), optionally after rotating the residual stream
(``circle_fx.quant.rotation.rotate_residual``: exact in float); the file is verified before it
is evaluated.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

#: (label, CircleQuantizer keyword arguments; ``quantize`` fills in a ``gptq`` variant's ``calibration``)
VARIANTS = [
    ("int16 act. / int8 per-row weights, all integer (default)", dict(activation_dtype="int16")),
    ("int16 act. / int8 per-tensor weights", dict(activation_dtype="int16", per_channel_weights=False)),
    ("int16 act. / int4 per-row weights, round to nearest", dict(activation_dtype="int16", weight_bits=4)),
    ("int16 act. / int4 per-row weights, gptq", dict(activation_dtype="int16", weight_bits=4, gptq=True)),
    ("int16 act. / int4 per-row weights, rotation + gptq",
     dict(activation_dtype="int16", weight_bits=4, gptq=True, rotate=True)),
]


def rotated_export(ev):
    """The checkpoint with its residual stream rotated (``circle_fx.quant.rotation``), exported."""
    import copy

    import torch

    import checkpoint as ck
    from circle_fx.quant.rotation import rotate_residual

    model = copy.deepcopy(ck.logits_model())  # the cached model stays as it is
    rotate_residual(model)
    return torch.export.export(model, (ev,), strict=False).module()


def linear_bits(cf) -> float:
    """Mean stored bits per weight of the file's FULLY_CONNECTED weights (each tensor once; INT4: 4)."""
    import math

    from circle_fx.circle import int4

    weights = {op.inputs[1] for op in cf.operators if op.name == "FULLY_CONNECTED"}
    counts = {i: math.prod(cf.tensors[i].shape) for i in weights}
    bits = sum(n * (4 if int4.is_int4(cf.tensors[i].type) else 8 * cf.tensors[i].dtype.itemsize)
               for i, n in counts.items())
    return bits / max(sum(counts.values()), 1)


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
        kwargs = dict(kwargs)
        source = rotated_export(ev) if kwargs.pop("rotate", False) else gm
        q = quantize(source, cal, **kwargs)
        with torch.no_grad():
            fq = q(ev)
        cm = circle_fx.export(q, (ev,), quant_target="npu")
        data = cm.to_bytes()
        circle_fx.verify(data)
        (logits,) = reference.run(data, [ev.numpy()])
        hist = cm.op_histogram()
        cells = [f"{ck.perplexity(fq, ev):.2f}", f"{ck.top1_agreement(fq.numpy(), ref.numpy()):.3f}",
                 f"{ck.perplexity(logits, ev):.2f}", f"{ck.top1_agreement(logits, ref.numpy()):.3f}",
                 f"{ck.top1_agreement(logits, fq.numpy()):.3f}", f"{linear_bits(read_circle(data)):.2f}"]
        print(f"| {label} | {' | '.join(cells)} | {time.perf_counter() - t:.0f} s |", flush=True)
        print(f"  file: {hist.get('RMS_NORM', 0)} RMS_NORM, {hist.get('FULLY_CONNECTED', 0)} FULLY_CONNECTED, "
              f"{len(cm.report.notes)} note(s)" + "".join(f"\n  note: {n}" for n in cm.report.notes), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
