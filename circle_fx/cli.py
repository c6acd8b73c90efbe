"""The ``circle-fx`` command line: ``export``, ``inspect``, ``explain``, ``export-llm``, ``generate``.

Models are named as ``MODULE:FACTORY``, where ``MODULE`` is a dotted module name or a
path to a ``.py`` file and ``FACTORY()`` returns ``(model, example_inputs)``. A factory is
the one thing a command line cannot avoid: a PyTorch model is code plus example inputs,
not a file.

Every error circle_fx raises on purpose (:class:`~circle_fx.errors.CircleFxError`) is
printed as one message on stderr with exit code 1; no traceback unless ``--traceback``.
Nothing is written unless the export succeeded (``CircleModel.save`` is atomic).
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from .errors import CircleFxError, InputError
from .factory import load_factory
from .paths import check_output_path
from .quant import options as quant_options


def build_model(spec: str):
    """Call the factory named by ``spec``; returns ``(model, example_inputs)``."""
    factory = load_factory(spec)
    try:
        result = factory()
    except CircleFxError:
        raise
    except Exception as e:
        raise InputError(f"{spec}() raised {type(e).__name__}: {e}") from e
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise InputError(f"{spec}() must return (model, example_inputs), got {type(result).__name__}"
                         + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else ""))
    return result[0], result[1]


# ------------------------------------------------------------------------ commands

def cmd_export(args) -> int:
    import circle_fx

    if not args.output.endswith(".circle"):
        raise InputError(f"{args.output}: the output name must end in .circle (onert picks its loader by extension)")
    check_output_path(args.output)  # before building and converting the model
    quantize = quant_options.quantize_from(args)  # bad options fail before the model is built
    if args.static and quantize is not None:
        raise InputError("--static (PT2E: uint8 activations and weights) and --quantize (weight-only) "
                         "are two schemes; give one")
    model, inputs = build_model(args.model)
    report = None
    if args.static:
        from .quant.static_flow import quantize_static

        calibration = None
        if args.calibration:
            calibration = load_factory(args.calibration)()
        model, report = quantize_static(model, inputs, calibration)
    cm = circle_fx.export(model, inputs, passes=[] if args.no_fuse else None,
                          cast_to_float32=args.cast_to_float32, quantize=quantize,
                          **(dict(quant_target="onert", quant_report=report) if args.static else {}))
    check = None
    if args.check:
        check = _compare_with_eager(cm, model, inputs)
        if not check <= args.atol:
            raise CircleFxError(f"--check: onert differs from torch eager by {check:.3g} "
                                f"(more than --atol {args.atol:g}); nothing was written")
    path = cm.save(args.output)
    print(f"wrote {path} ({cm.size:,} bytes, {len(cm.builder.operators)} operators, "
          f"{len(cm.report.fusions)} fusions)")
    if check is not None:
        print(f"onert vs torch eager: max abs diff {check:.3g}")
    if report is not None and not args.summary:  # the summary lists the report too
        print("\n".join(report.lines(args.report_top)))
    if args.summary:
        print(cm.summary())
    else:  # the summary lists them too
        for line in quant_options.override_report(cm):
            print(line)
    return 0


def _compare_with_eager(cm, model, inputs) -> float:
    import numpy as np
    import torch
    import torch.utils._pytree as pytree

    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    tensor_inputs = [x for x in inputs if isinstance(x, torch.Tensor)]
    got = cm.run(*tensor_inputs)
    with torch.no_grad():
        want = [x for x in pytree.tree_leaves(model(*inputs)) if isinstance(x, torch.Tensor)]
    if len(want) != len(got):
        raise CircleFxError(f"--check: eager returned {len(want)} tensors, the Circle model {len(got)}")
    return max((float(np.abs(g.astype(np.float64) - w.detach().numpy().astype(np.float64)).max())
                for g, w in zip(got, want) if w.numel()), default=0.0)


def cmd_inspect(args) -> int:
    from .circle.inspect import SECTIONS, inspect_file

    sections = SECTIONS if not args.only else tuple(args.only)
    print(inspect_file(args.file, sections))
    return 0


def cmd_explain(args) -> int:
    from .explain import explain

    model, inputs = build_model(args.model)
    print(explain(model, inputs).format())
    return 0


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="circle-fx",
        description="Compile unpatched PyTorch models to Circle (Samsung ONE).",
        epilog="MODEL is MODULE:FACTORY; MODULE is a dotted module or a path to a .py file, "
               "and FACTORY() returns (model, example_inputs). Try: circle-fx export "
               "circle_fx.demo:tiny_llama -o tiny.circle")
    p.add_argument("--traceback", action="store_true", help="show the full traceback on errors")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    e = sub.add_parser("export", help="convert a model to a .circle file")
    e.add_argument("model", metavar="MODEL", help="MODULE:FACTORY returning (model, example_inputs)")
    e.add_argument("-o", "--output", required=True, help="output path (must end in .circle)")
    e.add_argument("--summary", action="store_true", help="print the model summary")
    e.add_argument("--check", action="store_true",
                   help="run the result in onert and compare with torch eager before writing")
    e.add_argument("--atol", type=float, default=1e-4, help="--check tolerance (default 1e-4)")
    e.add_argument("--no-fuse", action="store_true",
                   help="run no optimisation passes (only the mandatory folding and DCE)")
    e.add_argument("--cast-to-float32", action="store_true",
                   help="export a float16/bfloat16 model in float32 (onert 0.1.0 runs no FLOAT16 tensor)")
    quant_options.add_arguments(e)
    e.add_argument("--static", action="store_true",
                   help="static PT2E quantization (CircleQuantizer(): uint8 linears, float residual stream) for "
                        "onert; prints the widest calibrated ranges and the linears with the lowest SQNR vs float")
    e.add_argument("--calibration", metavar="MODULE:FACTORY", default=None,
                   help="--static: FACTORY() returns a list of input tuples to calibrate on (default: the "
                        "example inputs)")
    e.add_argument("--report-top", type=int, default=5, metavar="N",
                   help="--static: how many ranges and worst layers to print (default 5)")
    e.set_defaults(func=cmd_export)

    i = sub.add_parser("inspect", help="print a .circle file's operators, tensors and buffers")
    i.add_argument("file", help="a .circle file")
    i.add_argument("--only", action="append", choices=["operators", "tensors", "buffers"],
                   help="show only this table (repeatable)")
    i.set_defaults(func=cmd_inspect)

    x = sub.add_parser("explain", help="show which fusions applied, and why others did not")
    x.add_argument("model", metavar="MODEL", help="MODULE:FACTORY returning (model, example_inputs)")
    x.set_defaults(func=cmd_explain)

    from .llm.cli import add_commands  # export-llm, generate

    add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if getattr(args, "compiler", True):  # `generate` runs a package: onert + numpy, no torch(ao) to quiet
        from .quiet import preload_noisy_libraries

        preload_noisy_libraries()
    try:
        return args.func(args)
    except CircleFxError as e:
        if args.traceback:
            raise
        print(f"circle-fx {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
