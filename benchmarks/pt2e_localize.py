"""Where the ``quant_target="onert"`` file departs from its fake-quant reference, on SmolLM2-135M.

    python benchmarks/pt2e_localize.py --tokens 128                 # per_channel_weights=True, 30 layers
    python benchmarks/pt2e_localize.py --tokens 64 --layers 2 --scheme default

Both sides compute the same ``convert_pt2e`` model with extra outputs ("taps"): every
quantized activation (each linear's input and output, as the reference dequantizes it) and
the residual stream after each attention and MLP block. The torch side runs the fake-quant
graph; the onert side runs ``circle_fx.export(..., quant_target="onert")`` of the very same
graph. Per tap, in graph order: for quantized taps the share of elements one or more steps
apart and the largest step difference; for residual taps the max/mean |difference| and the
top-1 agreement if the model were cut there (both streams through the float model's final norm
and lm_head). The first tap whose mismatch is non-zero is where the file stops computing what
the reference computes; the growth after it is the amplification.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SCHEMES = {"per-channel": dict(per_channel_weights=True), "default": dict(),
           "per-channel-float-out": dict(per_channel_weights=True, linear_outputs="float"),
           "float-out": dict(linear_outputs="float"),
           "per-channel-float-out-oproj": dict(per_channel_weights=True, linear_outputs="float",
                                               skip=("*mlp.down_proj", "*self_attn.o_proj"))}


def _path(n) -> str:
    stack = n.meta.get("nn_module_stack") or {}
    return list(stack.values())[-1][0] if stack else ""


def _short(path: str) -> str:
    return re.sub(r"^model\.model\.", "", path)


def add_taps(gm):
    """Rewrite ``gm``'s output as ``(logits, *taps)``; returns ``[(label, kind, scale)]``."""
    import torch

    qd = torch.ops.quantized_decomposed
    aten = torch.ops.aten
    taps, info = [], []
    out = next(n for n in gm.graph.nodes if n.op == "output")
    out_nodes = set(out.all_input_nodes)
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is qd.quantize_per_tensor.default and n.args[0].op == "call_function":
            src = n.args[0]
            dqs = [u for u in n.users if u.target is qd.dequantize_per_tensor.default]
            if not dqs or dqs[0] in out_nodes:
                continue
            if src.target is aten.linear.default:
                label = f"{_short(_path(src))} out"
            else:
                users = sorted({_short(_path(u)) for d in dqs for u in d.users if u.op == "call_function"})
                label = f"{'+'.join(users) or src.name} in ({src.target.__name__ if hasattr(src.target, '__name__') else src.target})"
            taps.append(dqs[0])
            info.append((label, "q", float(n.args[1])))
        elif n.target is aten.add.Tensor and re.search(r"layers\.\d+$", _path(n)):
            taps.append(n)
            info.append((f"{_short(_path(n))} residual ({sum(1 for k, _, _ in info if k.startswith(_short(_path(n)) + ' residual')) and 'after mlp' or 'after attn'})", "r", None))
    (first,) = out.args[0] if isinstance(out.args[0], (tuple, list)) else (out.args[0],)
    out.args = ((first, *taps),)
    codegen = gm.graph._codegen  # torch.export's module unflattens its outputs by a pytree spec
    if getattr(codegen, "pytree_info", None) is not None:
        from torch.utils._pytree import tree_flatten

        spec = tree_flatten(tuple(range(1 + len(taps))))[1]
        codegen.pytree_info = codegen.pytree_info._replace(out_spec=spec)
    gm.graph.lint()
    gm.recompile()
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--layers", type=int, default=None, help="cut the model to its first N decoder layers")
    ap.add_argument("--scheme", choices=sorted(SCHEMES), default="per-channel")
    ap.add_argument("--all", action="store_true", help="print every tap, not only the residual ones and the first mismatches")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import numpy as np
    import torch

    import checkpoint as ck
    import circle_fx
    from pt2e_accuracy import quantize

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
    t = time.perf_counter()
    q = quantize(gm, cal, **SCHEMES[args.scheme])
    info = add_taps(q)
    with torch.no_grad():
        fq = [x.numpy() for x in q(ev)]
    t_q = time.perf_counter() - t
    cm = circle_fx.export(q, (ev,), quant_target="onert")
    on = cm.run(ev.numpy())
    print(f"SmolLM2-135M, {args.layers or len(layers)} layers, {args.tokens} tokens, scheme {args.scheme}: "
          f"quantize {t_q:.0f} s, export+onert {time.perf_counter() - t - t_q:.0f} s")
    print(f"float ppl {ck.perplexity(ref, ev):.2f}; fake-quant {ck.perplexity(fq[0], ev):.2f}; onert "
          f"{ck.perplexity(on[0], ev):.2f}; top-1 onert vs fake-quant {ck.top1_agreement(on[0], fq[0]):.3f}")
    hf = ck.load_model()

    def head(h):
        with torch.no_grad():
            return hf.lm_head(hf.model.norm(torch.as_tensor(h))).numpy()

    print()
    print("| tap | kind | elements >= 1 step apart | max steps | max abs diff | mean abs diff | top-1 if cut here |")
    print("|---|---|---|---|---|---|---|")
    seen = False
    for (label, kind, scale), a, b in zip(info, fq[1:], on[1:]):
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
        if kind == "q":
            steps = d / scale
            frac = float((steps > 0.5).mean())
            if args.all or (frac and not seen):
                print(f"| {label} | uint8 | {frac:.2e} | {steps.max():.0f} | {d.max():.3g} | {d.mean():.3g} | |")
            seen = seen or frac > 0
        else:
            top1 = ck.top1_agreement(head(b), head(a))
            print(f"| {label} | float | | | {d.max():.3g} | {d.mean():.3g} | {top1:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
