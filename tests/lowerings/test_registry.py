"""The lowering registry as an extension surface: built-ins load eagerly, a user lowering
adds to them (never replaces them all), re-registering warns, and every lowering module
is picked up without an import list."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

import circle_fx
from circle_fx.emit import registry
from circle_fx.emit.registry import LOWERINGS, builtin_targets, lowering, lowering_for

circle_fx.load_compiler()  # builtin_targets sees only what is registered; import circle_fx is lazy

aten = torch.ops.aten
ROOT = pathlib.Path(__file__).resolve().parents[2]

#: erf(x) ~ tanh(2/sqrt(pi) * (x + 0.08943 x^3)) (the GELU tanh approximation; |error| < 4e-4)
USER_ERF = textwrap.dedent("""
    import math, sys
    import numpy as np, torch
    from circle_fx.circle.schema import BO, make_options
    from circle_fx.emit.registry import LOWERINGS, lowering

    assert LOWERINGS, "built-in lowerings are not loaded before the first export"
    n_builtin = len(LOWERINGS)

    @lowering(torch.ops.aten.erf.default)
    def erf(ctx, node):
        x, dt = node.args[0], ctx.dtype(node)
        sq, poly, poly1, arg = (ctx.like(node, n) for n in ("sq", "poly", "poly1", "arg"))
        ctx.op(BO.MUL, [ctx.tensor(x), ctx.tensor(x)], [sq], make_options("MulOptions"))
        ctx.op(BO.MUL, [sq, ctx.tensor(0.044715 * 2, dt)], [poly], make_options("MulOptions"))
        ctx.op(BO.ADD, [poly, ctx.tensor(1.0, dt)], [poly1], make_options("AddOptions"))
        ctx.op(BO.MUL, [ctx.tensor(x), poly1], [arg], make_options("MulOptions"))
        scaled = ctx.like(node, "scaled")
        ctx.op(BO.MUL, [arg, ctx.tensor(2 / math.sqrt(math.pi), dt)], [scaled], make_options("MulOptions"))
        ctx.op(BO.TANH, [scaled], [ctx.output(node)])

    assert len(LOWERINGS) == n_builtin + 1

    class M(torch.nn.Module):
        def forward(self, x, y):
            return torch.erf(x) + y * 2

    import circle_fx
    x, y = torch.linspace(-3, 3, 24).reshape(2, 12), torch.randn(2, 12)
    cm = circle_fx.export(M(), (x, y))
    out = cm.run(x, y)[0]
    np.testing.assert_allclose(out, (torch.erf(x) + y * 2).numpy(), atol=1e-3)
    print("OK")
""")


def test_user_lowering_first_keeps_every_builtin():
    """A fresh interpreter whose first act is registering ``aten.erf``: ``add`` and ``mul``
    still lower (before: the lazy import ran only on an empty table, so all built-ins vanished)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", USER_ERF], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "OK" in r.stdout


def test_reregistering_a_target_warns_and_names_both_functions():
    target = aten.neg.default
    old = LOWERINGS[target]
    try:
        with pytest.warns(UserWarning, match=r"aten\.neg\.default.*my_neg.*replaces.*" + old.__qualname__):
            @lowering(target)
            def my_neg(ctx, node):  # pragma: no cover - never called
                raise AssertionError
        assert lowering_for(target) is my_neg
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            lowering(target, override=True)(old)  # explicit: no warning
        assert lowering_for(target) is old
    finally:
        LOWERINGS[target] = old


def test_registering_the_same_function_again_is_silent():
    target = aten.neg.default
    fn = LOWERINGS[target]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lowering(target)(fn)
    assert LOWERINGS[target] is fn


def test_every_lowering_module_is_imported():
    """No hand-kept import list: each public file in emit/lowerings registers something."""
    folder = ROOT / "circle_fx" / "emit" / "lowerings"
    names = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}
    assert names, folder
    for name in names:
        assert f"circle_fx.emit.lowerings.{name}" in sys.modules, name
    targets = builtin_targets(("circle_fx.emit.lowerings",))
    defining = {fn.__module__.rsplit(".", 1)[1] for t, fn in LOWERINGS.items() if t in targets}
    assert defining == names, names ^ defining


def test_lookup_does_not_import():
    """``lowering_for`` is a plain table lookup (the built-ins were loaded with the package)."""
    import inspect

    src = inspect.getsource(registry.lowering_for)
    assert "import" not in src
    assert lowering_for(aten.add.Tensor) is not None
