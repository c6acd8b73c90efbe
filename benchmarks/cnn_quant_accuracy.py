"""Quantized CNNs in onert: accuracy of each quantization route on a fixed input set.

Tiny transformers ``ResNetForImageClassification`` / ``MobileNetV2ForImageClassification``
(random He-initialised convolutions, BatchNorm statistics perturbed so folding matters), ``--images`` seeded
random 64x64 images. For each route, the Circle file runs in onert on every image and is
compared with torch eager float32:

- ``float``: ``circle_fx.export`` (the baseline: float32 rounding only);
- ``int8-weights``: ``quantize="int8-weights"``: every convolution weight int8 per output
  channel (hybrid CONV_2D / DEPTHWISE_CONV_2D), the classifier int8 per row (hybrid FC);
- ``pt2e``: ``CircleQuantizer`` + torchao ``prepare_pt2e`` / ``convert_pt2e`` (calibrated on
  ``--calibration`` other seeded images), exported with ``quant_target="onert"``; also compared
  with the fake-quantized torch model it was converted to (``vs fake-quant``).

Columns: top-1 agreement with eager over the images, the max |logit error| and the relative
L2 error of the logits (all images), file size, and the quantized convolution operators.

    PYTHONPATH=$PWD python benchmarks/cnn_quant_accuracy.py [--images 64] [--routes float,int8-weights,pt2e]
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import circle_fx  # noqa: E402
from circle_fx.circle.reader import read_circle  # noqa: E402

SIZE = 64


def build(name: str) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "resnet":
            cfg = transformers.ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32, 64, 128],
                                            depths=[1, 1, 1, 1], layer_type="basic", num_labels=10)
            model = transformers.ResNetForImageClassification(cfg)
        else:
            cfg = transformers.MobileNetV2Config(num_channels=3, image_size=SIZE, depth_multiplier=0.35, num_labels=10)
            model = transformers.MobileNetV2ForImageClassification(cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Conv2d):  # He init: transformers' random MobileNetV2 gives constant logits
                torch.nn.init.kaiming_normal_(m.weight, nonlinearity="relu", generator=g)
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1, generator=g)
                m.running_var.uniform_(0.5, 1.5, generator=g)
    return model.eval()


class Logits(torch.nn.Module):
    """The model's logits as a plain tensor (torch.export / PT2E see one output)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x, return_dict=False)[0]


def images(n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 3, SIZE, SIZE, generator=g) for _ in range(n)]


def quantized_convs(cm) -> str:
    cf = read_circle(cm.to_bytes())
    kinds = {}
    for op in cf.operators:
        if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            w = cf.tensors[op.inputs[1]]
            q = w.quantization
            key = f"{op.name} {w.type_name}" + ("" if q is None else " per-channel" if q.per_channel else " per-tensor")
            kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))


def pt2e(model, xs, calib):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from circle_fx.quant.pt2e import CircleQuantizer

    gm = torch.export.export(model, (xs[0],)).module()
    prepared = prepare_pt2e(gm, CircleQuantizer())
    with torch.no_grad():
        for x in calib:
            prepared(x)
    converted = convert_pt2e(prepared)
    return circle_fx.export(converted, (xs[0],), quant_target="onert", verbose=False), converted


def row(name: str, route: str, xs, calib) -> list[str]:
    model = Logits(build(name)).eval()
    fake = None
    if route == "pt2e":
        cm, fake = pt2e(model, xs, calib)
    else:
        cm = circle_fx.export(model, (xs[0],), quantize=None if route == "float" else route, verbose=False)
    agree = agree_fake = 0
    err, num, den = 0.0, 0.0, 0.0
    for x in xs:
        with torch.no_grad():
            ref = model(x).numpy()
        got = cm.run(x)[0]
        agree += int(ref.argmax() == got.argmax())
        err = max(err, float(np.abs(got - ref).max()))
        num += float(((got - ref) ** 2).sum())
        den += float((ref ** 2).sum())
        if fake is not None:
            with torch.no_grad():
                agree_fake += int(fake(x).numpy().argmax() == got.argmax())
    n = len(xs)
    return [name, route, f"{agree}/{n}", f"{agree_fake}/{n}" if fake is not None else "-", f"{err:.3g}",
            f"{(num / den) ** 0.5:.3g}", f"{cm.size / 1024:.0f}", quantized_convs(cm)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--calibration", type=int, default=32)
    ap.add_argument("--models", default="resnet,mobilenet_v2")
    ap.add_argument("--routes", default="float,int8-weights,pt2e")
    args = ap.parse_args()
    xs, calib = images(args.images, 0), images(args.calibration, 1)
    print("| model | route | top-1 vs eager | top-1 vs fake-quant | max abs err | rel L2 err | file KiB | convolutions |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for route in args.routes.split(","):
            print("| " + " | ".join(row(name, route, xs, calib)) + " |", flush=True)


if __name__ == "__main__":
    main()
