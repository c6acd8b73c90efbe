"""Where a PT2E-quantized CNN loses accuracy (issue 21 item 5): the onert file against its torch
fake-quant reference, and the fake-quant reference against float, layer by layer.

The model and images are ``cnn_quant_accuracy.py``'s (tiny transformers MobileNetV2 / ResNet,
He-initialised, BatchNorm statistics perturbed). After ``prepare_pt2e`` + calibration, every
observer of the prepared model is replaced by a *tap*: it records the value it sees and, when
switched on, fake-quantizes it with the observer's calibrated parameters (what ``convert_pt2e``
puts there as Q -> DQ). One graph then computes float (all taps off), the full fake-quant
reference (all on), weights only, activations only, or a single quantization point, so the
error can be assigned to points and layers without matching two graphs node by node.

Printed (relative L2 of the logits over ``--images`` images, unless stated):

1. onert file vs ``convert_pt2e``'s model (the fake-quant reference) vs float, and the taps'
   all-on model vs ``convert_pt2e``'s (checks that the taps compute the reference);
2. per activation point, in graph order: its own relative error in the fake-quant model
   (tap value all-on vs all-off: accumulated error up to there) and the logits' error when only
   that point is quantized (its share), with the observed range and scale;
3. the weights-only / activations-only splits;
4. ``--schemes``: alternatives run end to end in onert (each a ``CircleQuantizer`` argument
   set), e.g. the activation observer.

    PYTHONPATH=$PWD python benchmarks/cnn_quant_localize.py [--model mobilenet_v2] [--images 16]
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import circle_fx  # noqa: E402
from cnn_quant_accuracy import Logits, build, images  # noqa: E402


class Tap(torch.nn.Module):
    """An observer's stand-in: records its input; fake-quantizes it when ``on``."""

    def __init__(self, obs, name: str, is_weight: bool):
        super().__init__()
        self.obs, self.name, self.is_weight = obs, name, is_weight
        self.on, self.seen = False, []
        scale, zp = obs.calculate_qparams()
        self.scale, self.zp = scale.detach().float(), zp.detach().to(torch.int32)
        self.per_channel = self.scale.numel() > 1 or getattr(obs, "ch_axis", None) is not None and \
            obs.qscheme in (torch.per_channel_affine, torch.per_channel_symmetric)

    def forward(self, x):
        if not self.is_weight:
            self.seen.append(x.detach().clone())
        if not self.on:
            return x
        o = self.obs
        if self.per_channel:
            return torch.fake_quantize_per_channel_affine(x, self.scale, self.zp, o.ch_axis, o.quant_min, o.quant_max)
        return torch.fake_quantize_per_tensor_affine(x, float(self.scale), int(self.zp), o.quant_min, o.quant_max)


def data_bn(model, calib):
    """``model`` with every BatchNorm's running statistics re-estimated on ``calib`` (cumulative
    average, train-mode forward, no weight changes): the statistics a trained network's BatchNorms
    hold for their inputs, instead of the benchmark's random ones (each layer then normalizes)."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    with torch.no_grad():
        for x in calib:
            model(x)
    return model.eval()


def make_model(name, calib, bn: str):
    model = Logits(build(name)).eval()
    return data_bn(model, calib) if bn == "data" else model


def prepared_with_taps(model, calib, quantizer):
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    gm = torch.export.export(model, (calib[0],)).module()
    prepared = prepare_pt2e(gm, quantizer)
    with torch.no_grad():
        for x in calib:
            prepared(x)
    import copy

    converted = convert_pt2e(copy.deepcopy(prepared))
    taps, constant = [], set()
    for n in prepared.graph.nodes:
        if n.op == "get_attr" or (n.op in ("call_function", "call_module") and n.all_input_nodes
                                  and all(a in constant for a in n.all_input_nodes)):
            constant.add(n)
        if n.op != "call_module" or "activation_post_process" not in n.target:
            continue
        src = n.args[0]
        is_weight = src in constant
        if isinstance(getattr(prepared, n.target), Tap):  # one observer read twice (shared)
            continue
        tap = Tap(getattr(prepared, n.target), src.name, is_weight)
        setattr(prepared, n.target, tap)
        taps.append(tap)
    return prepared, converted, taps


def add_taps(gm) -> list[tuple[str, float]]:
    """Make ``gm`` (``convert_pt2e``'s model) return ``(logits, *taps)``: every quantized
    activation as its first DEQUANTIZE reads it; returns ``[(label, scale)]``."""
    qd = torch.ops.quantized_decomposed
    out = next(n for n in gm.graph.nodes if n.op == "output")
    out_nodes = set(out.all_input_nodes)
    taps, info = [], []
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is qd.quantize_per_tensor.default and n.args[0].op != "get_attr":
            dqs = [u for u in n.users if u.target is qd.dequantize_per_tensor.default]
            if dqs and dqs[0] not in out_nodes:
                taps.append(dqs[0])
                info.append((n.args[0].name, float(n.args[1])))
    (first,) = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    out.args = ((first, *taps),)
    codegen = gm.graph._codegen
    if getattr(codegen, "pytree_info", None) is not None:
        from torch.utils._pytree import tree_flatten

        codegen.pytree_info = codegen.pytree_info._replace(out_spec=tree_flatten(tuple(range(1 + len(taps))))[1])
    gm.graph.lint()
    gm.recompile()
    return info


def onert_taps(converted, xs) -> None:
    """Per quantized activation, in graph order: the share of elements where the onert file is
    one or more steps from the fake-quant reference, the largest step difference, and that
    tap's relative L2 difference."""
    import copy

    gm = copy.deepcopy(converted)
    info = add_taps(gm)
    cm = circle_fx.export(gm, (xs[0],), quant_target="onert", verbose=False)
    with torch.no_grad():
        ref = [[t.numpy() for t in gm(x)] for x in xs]
    got = [cm.run(x) for x in xs]
    print("\n| # | quantized value | elements >= 1 step off | max steps | rel L2 onert vs fake-quant |\n|---|---|---|---|---|")
    for k, (name, scale) in enumerate(info, 1):
        d = [np.abs(g[k].reshape(r[k].shape) - r[k]) / scale for g, r in zip(got, ref)]
        off = sum(int((v > 0.5).sum()) for v in d) / sum(v.size for v in d)
        rel = rel_l2([g[k].reshape(r[k].shape) for g, r in zip(got, ref)], [r[k] for r in ref])
        print(f"| {k - 1} | {name} | {off:.4f} | {max(float(v.max()) for v in d):.0f} | {rel:.4f} |")


def amplification(model, xs, rel: float = 0.01) -> float:
    """Relative L2 of the float logits when every input gets Gaussian noise of ``rel`` of its
    RMS: how much this network amplifies a small perturbation (quantization noise is one)."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        ref = [model(x).numpy() for x in xs]
        got = [model(x + rel * x.pow(2).mean().sqrt() * torch.randn(x.shape, generator=g)).numpy() for x in xs]
    return rel_l2(got, ref)


def rel_l2(got: list, ref: list) -> float:
    num = sum(float(((g - r) ** 2).sum()) for g, r in zip(got, ref))
    den = sum(float((r ** 2).sum()) for r in ref)
    return (num / den) ** 0.5


def run(prepared, taps, xs, on):
    for t in taps:
        t.on = on(t)
        t.seen = []
    with torch.no_grad():
        return [prepared(x).numpy() for x in xs]


def localize(name: str, xs, calib, top: int, onert: bool = False, bn: str = "random") -> None:
    from circle_fx.quant.pt2e import CircleQuantizer

    model = make_model(name, calib, bn)
    with torch.no_grad():
        ref = [model(x).numpy() for x in xs]
    prepared, converted, taps = prepared_with_taps(model, calib, CircleQuantizer())
    with torch.no_grad():
        fake = [converted(x).numpy() for x in xs]
    cm = circle_fx.export(converted, (xs[0],), quant_target="onert", verbose=False)
    got = [cm.run(x)[0] for x in xs]
    acts = [t for t in taps if not t.is_weight]
    print(f"\n### {name}: {len(acts)} activation and {len(taps) - len(acts)} weight quantization points\n")
    floats = run(prepared, taps, xs, lambda t: False)
    float_seen = [t.seen for t in acts]
    all_on = run(prepared, taps, xs, lambda t: True)
    fake_seen = [t.seen for t in acts]
    print("| comparison | rel L2 of the logits |\n|---|---|")
    for label, a, b in (("onert file vs fake-quant (convert_pt2e)", got, fake), ("fake-quant vs float", fake, ref),
                        ("onert file vs float", got, ref), ("taps all on vs convert_pt2e", all_on, fake),
                        ("taps all off vs float", floats, ref)):
        print(f"| {label} | {rel_l2(a, b):.4f} |")
    print(f"| float model, 1 % input noise vs float (amplification) | {amplification(model, xs):.4f} |")
    w_only = run(prepared, taps, xs, lambda t: t.is_weight)
    a_only = run(prepared, taps, xs, lambda t: not t.is_weight)
    print(f"| weights only vs float | {rel_l2(w_only, ref):.4f} |")
    print(f"| activations only vs float | {rel_l2(a_only, ref):.4f} |")
    rows = []
    for i, t in enumerate(acts):
        own = rel_l2([v.numpy() for v in fake_seen[i]], [v.numpy() for v in float_seen[i]])
        alone = rel_l2(run(prepared, taps, xs, lambda u, t=t: u is t), ref)
        lo = float(min(v.min() for v in float_seen[i]))
        hi = float(max(v.max() for v in float_seen[i]))
        std = float(torch.cat([v.reshape(-1) for v in float_seen[i]]).std())
        rows.append((i, t.name, own, alone, lo, hi, std, float(t.scale)))
    print("\n| # | quantized value | its rel L2 (fake-quant vs float) | logits rel L2, this point alone | "
          "range (float) | std | scale |\n|---|---|---|---|---|---|---|")
    for i, nm, own, alone, lo, hi, std, s in rows:
        print(f"| {i} | {nm} | {own:.4f} | {alone:.4f} | [{lo:.3g}, {hi:.3g}] | {std:.3g} | {s:.3g} |")
    worst = sorted(rows, key=lambda r: -r[3])[:top]
    print(f"\nlargest single points: " + ", ".join(f"{r[1]} {r[3]:.4f}" for r in worst))
    wts = [t for t in taps if t.is_weight]
    if onert:
        onert_taps(converted, xs)
    wrows = sorted(((rel_l2(run(prepared, taps, xs, lambda u, t=t: u is t), ref), t.name) for t in wts), reverse=True)
    print("largest single weights: " + ", ".join(f"{nm} {e:.4f}" for e, nm in wrows[:top]))


def schemes(name: str, xs, calib, specs: list[str], bn: str = "random") -> None:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from circle_fx.quant.pt2e import CircleQuantizer

    model = make_model(name, calib, bn)
    with torch.no_grad():
        ref = [model(x).numpy() for x in xs]
    print(f"\n### {name} (BatchNorm statistics: {bn}; amplification of 1 % input noise: "
          f"{amplification(model, xs):.4f}): schemes end to end\n\n| CircleQuantizer(...) | fake-quant vs float | onert vs float | "
          "onert vs fake-quant |\n|---|---|---|---|")
    for spec in specs:
        kwargs = eval(f"dict({spec})")  # noqa: S307  (benchmark argument: trusted)
        gm = torch.export.export(model, (xs[0],)).module()
        prepared = prepare_pt2e(gm, CircleQuantizer(**kwargs))
        with torch.no_grad():
            for x in calib:
                prepared(x)
        converted = convert_pt2e(prepared)
        with torch.no_grad():
            fake = [converted(x).numpy() for x in xs]
        try:
            cm = circle_fx.export(converted, (xs[0],), quant_target="onert", verbose=False)
            got = [cm.run(x)[0] for x in xs]
            on, vs = f"{rel_l2(got, ref):.4f}", f"{rel_l2(got, fake):.4f}"
        except Exception as e:  # noqa: BLE001  (a scheme the exporter refuses is a row too)
            on, vs = f"- ({type(e).__name__}: {str(e).splitlines()[0][:80]})", "-"
        print(f"| {spec or '(default)'} | {rel_l2(fake, ref):.4f} | {on} | {vs} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--images", type=int, default=16)
    ap.add_argument("--calibration", type=int, default=32)
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--no-localize", action="store_true")
    ap.add_argument("--bn", choices=("random", "data"), default="random",
                    help="BatchNorm statistics: the benchmark's random ones, or re-estimated on the calibration images")
    ap.add_argument("--onert-taps", action="store_true", help="also every quantized activation, onert vs fake-quant")
    ap.add_argument("--schemes", default="", help="';'-separated CircleQuantizer keyword lists, e.g. "
                    "\"activation_observer='mse'\"")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    xs, calib = images(args.images, 0), images(args.calibration, 1)
    if not args.no_localize:
        localize(args.model, xs, calib, args.top, args.onert_taps, args.bn)
    if args.schemes:
        schemes(args.model, xs, calib, [s.strip() for s in args.schemes.split(";")], args.bn)


if __name__ == "__main__":
    main()
