"""Run Circle files and LLM packages on onert's aarch64 build from this x86 machine (qemu-user).

    python scripts/arm64.py setup [--install]     # build the cached arm64 side (~40 s; --install: apt-get
                                                  #   qemu-user-static + debootstrap first, as root)
    python scripts/arm64.py check                 # is it usable here? (exit 1 and the reason if not)
    python scripts/arm64.py run m.circle x.npy [y.npy ...] [-o OUTDIR]
                                                  # arm64 outputs (OUTDIR/out0.npy ...) and max |arm64 - x86|
    python scripts/arm64.py generate PKG --ids 5 17 9 [--new 8]
                                                  # greedy tokens of a package on arm64 and on x86

The arm64 side is :mod:`circle_fx.circle.arm64` (cached under ~/.cache/circle_fx/arm64, keyed by the
onert / numpy versions); ``make arm64`` runs ``setup --install``.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(args) -> int:
    import numpy as np

    from circle_fx.circle.arm64 import Arm64Runtime
    from circle_fx.circle.runtime import OnertSession

    from circle_fx.circle.ggml_support import check_ggml_runs
    from circle_fx.errors import InputError, RuntimeFailure

    inputs = []
    for p in args.inputs:
        try:
            inputs.append(np.load(p, allow_pickle=False))
        except (OSError, ValueError) as e:
            raise InputError(f"input {p!r}: not a readable .npy file ({e})") from None
    with Arm64Runtime() as rt:
        arm = rt.session(args.file).run(inputs)
    try:
        check_ggml_runs(args.file)
        x86 = OnertSession(args.file).run(inputs)
    except RuntimeFailure as e:  # GGML weights on an x86 CPU without AVX-512: arm64's outputs alone
        print(f"x86 onert not run: {e}", file=sys.stderr)
        x86 = [None] * len(arm)
    if args.o:
        os.makedirs(args.o, exist_ok=True)
    for k, (a, x) in enumerate(zip(arm, x86)):
        if args.o:
            np.save(os.path.join(args.o, f"out{k}.npy"), a)
        if x is None:
            print(f"output {k}: {list(a.shape)} {a.dtype} (no x86 run)")
            continue
        diff = float(np.abs(a.astype(np.float64) - x).max()) if a.size else 0.0
        print(f"output {k}: {list(a.shape)} {a.dtype}, max |arm64 - x86| = {diff:.3g}")
    return 0


def generate(args) -> int:
    from circle_fx.circle.arm64 import Arm64Runtime
    from circle_fx.llm.runner import LLMRunner

    with Arm64Runtime() as rt:
        arm = LLMRunner(args.package, runtime=rt).generate(args.ids, args.new, eos_token_ids=[])
    from circle_fx.errors import RuntimeFailure

    n = len(args.ids)
    print("arm64:", arm[n:])
    try:
        x86 = LLMRunner(args.package).generate(args.ids, args.new, eos_token_ids=[])
    except RuntimeFailure as e:  # GGML weights on an x86 CPU without AVX-512: arm64's tokens alone
        print(f"x86 onert not run: {e}")
        return 0
    print("x86:  ", x86[n:])
    diff = next((i for i, (a, b) in enumerate(zip(arm[n:], x86[n:])) if a != b), None)
    print("same tokens" if diff is None else f"first difference at new token {diff}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("setup")
    s.add_argument("--install", action="store_true")
    sub.add_parser("check")
    r = sub.add_parser("run")
    r.add_argument("file")
    r.add_argument("inputs", nargs="*")
    r.add_argument("-o", default=None, help="directory for the arm64 outputs as .npy")
    g = sub.add_parser("generate")
    g.add_argument("package")
    g.add_argument("--ids", type=int, nargs="+", required=True)
    g.add_argument("--new", type=int, default=8)
    args = ap.parse_args(argv)
    from circle_fx.circle import arm64
    from circle_fx.errors import CircleFxError

    try:
        if args.command == "setup":
            return arm64.main(["setup"] + (["--install"] if args.install else []))
        if args.command == "check":
            return arm64.main(["check"])
        return run(args) if args.command == "run" else generate(args)
    except CircleFxError as e:
        print(f"arm64: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
