"""A MobileNetV2 / ResNet-sized CNN: conversion time vs ``torch.export``, onert latency vs eager.

transformers' ``MobileNetV2ForImageClassification`` and ``ResNetForImageClassification`` at
their default (ImageNet) configs, random weights, eval mode, one 224x224 image. For each:
``torch.export`` alone, ``circle_fx.export`` (export + passes + lowering + verify), the
Circle file's operator counts (CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE, and what is left
elementwise), then ``--runs`` calls of eager and onert interleaved (one of each per round;
median ms) and the max difference of the logits.

    PYTHONPATH=$PWD python benchmarks/cnn_speed.py [--runs 20] [--threads 1] [--model mobilenet_v2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import circle_fx  # noqa: E402

MODELS = {"mobilenet_v2": ("MobileNetV2Config", "MobileNetV2ForImageClassification"),
          "resnet": ("ResNetConfig", "ResNetForImageClassification")}


def build(name: str) -> torch.nn.Module:
    import transformers

    cfg_name, cls_name = MODELS[name]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = getattr(transformers, cls_name)(getattr(transformers, cfg_name)()).eval()
    with torch.no_grad():  # BatchNorm statistics that are not the identity, so folding matters
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model


def row(name: str, runs: int) -> list[str]:
    model = build(name)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    torch.export.export(model, (x,), kwargs={"return_dict": False})
    t_export = time.perf_counter() - t0
    t0 = time.perf_counter()
    cm = circle_fx.export(model, (x,), example_kwargs={"return_dict": False}, verbose=False)
    t_convert = time.perf_counter() - t0
    hist = cm.op_histogram()
    eager_ms, onert_ms = [], []
    with torch.no_grad():
        ref = model(x, return_dict=False)[0].numpy()
        out = cm.run(x)[0]  # warm-up (session creation)
        for _ in range(runs):
            t0 = time.perf_counter()
            model(x, return_dict=False)
            eager_ms.append(1e3 * (time.perf_counter() - t0))
            t0 = time.perf_counter()
            out = cm.run(x)[0]
            onert_ms.append(1e3 * (time.perf_counter() - t0))
    conv = hist.get("CONV_2D", 0) + hist.get("DEPTHWISE_CONV_2D", 0)
    rest = sum(v for k, v in hist.items() if k in ("MUL", "ADD", "SUB", "RELU", "MAXIMUM", "MINIMUM"))
    return [name, f"{t_export:.1f}", f"{t_convert:.1f}", str(conv), str(hist.get("TRANSPOSE", 0)), str(rest),
            str(sum(hist.values())), f"{statistics.median(eager_ms):.1f}", f"{statistics.median(onert_ms):.1f}",
            f"{float(np.abs(out - ref).max()):.2g}"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", choices=sorted(MODELS), action="append")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    head = ["model", "torch.export s", "circle_fx.export s", "convs", "TRANSPOSE", "elementwise left", "ops",
            "eager ms", "onert ms", "max abs diff"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in args.model or sorted(MODELS):
        print("| " + " | ".join(row(name, args.runs)) + " |", flush=True)


if __name__ == "__main__":
    main()
