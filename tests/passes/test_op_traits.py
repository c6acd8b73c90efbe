"""The FX op-traits table (``circle_fx/op_traits.py``) is the one place that says what an op is.

An AST scan over circle_fx/ refuses a module that binds its own set of aten targets (a name
assigned a set / frozenset / tuple / list of two or more ``aten.op.overload`` targets, or any
set literal of them, or an inline collection spanning three or more ops): such sets drifted
apart before (six "view-like" sets, three elementwise ones), and a fused op missing from one of
them silently cost run-time TRANSPOSEs. Dicts (lowering tables, decompositions: target ->
something) and two-op inline checks (``t in (aten.div.Tensor, aten.div.Scalar)``) are allowed.
"""
from __future__ import annotations

import ast
import pathlib

import pytest
import torch

import circle_fx
from circle_fx import op_traits
from circle_fx.op_traits import ELEMENTWISE, MOVEMENT, PERMUTE, VIEW, Trait

PKG = pathlib.Path(circle_fx.__file__).parent
aten = torch.ops.aten


def _aten_op(e) -> str | None:
    """``aten.op.overload`` / ``torch.ops.aten.op.overload`` -> ``op``, else None."""
    if not (isinstance(e, ast.Attribute) and isinstance(e.value, ast.Attribute)):
        return None
    base = e.value.value
    if (isinstance(base, ast.Name) and base.id == "aten") or (isinstance(base, ast.Attribute) and base.attr == "aten"):
        return e.value.attr
    return None


def _targets(node) -> list[str]:
    if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        return [op for op in map(_aten_op, node.elts) if op]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("set", "frozenset") \
            and node.args:
        return _targets(node.args[0])
    return []


def violations(source: str, where: str) -> list[str]:
    out = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None and len(_targets(n.value)) >= 2:
            out.append(f"{where}:{n.lineno}: binds a set of {len(_targets(n.value))} aten targets")
        elif isinstance(n, ast.Set) and len(_targets(n)) >= 2:
            out.append(f"{where}:{n.lineno}: a set literal of aten targets")
        elif isinstance(n, (ast.Tuple, ast.List)) and len(set(_targets(n))) >= 3:
            out.append(f"{where}:{n.lineno}: an inline collection of {len(set(_targets(n)))} aten ops")
    return sorted(set(out))


def test_no_module_outside_the_table_defines_a_set_of_aten_targets():
    files = [p for p in sorted(PKG.rglob("*.py")) if p.name != "op_traits.py" or p.parent != PKG]
    assert len(files) > 100
    found = [v for p in files for v in violations(p.read_text(), str(p.relative_to(PKG)))]
    assert not found, "sets of aten targets outside circle_fx/op_traits.py:\n  " + "\n  ".join(found)


def test_the_scan_catches_each_kind():
    bad = ("aten = torch.ops.aten\n"
           "VIEWS = {aten.view.default, aten.reshape.default}\n"
           "PAIR = (torch.ops.aten.add.Tensor, torch.ops.aten.sub.Tensor)\n"
           "FROZEN = frozenset([aten.mean.dim, aten.sum.dim_IntList])\n"
           "def f(n):\n"
           "    return n.target in {aten.relu.default, aten.clamp.default} or "
           "n.target in (aten.exp.default, aten.log.default, aten.sin.default)\n")
    found = "\n".join(violations(bad, "bad.py"))
    for line in (2, 3, 4, 6):
        assert f"bad.py:{line}:" in found, (line, found)
    ok = ("LOWER = {aten.neg.default: 1, aten.exp.default: 2}\n"
          "def f(n):\n    return n.target in (aten.div.Tensor, aten.div.Scalar)\n")
    assert violations(ok, "ok.py") == []


def test_traits_are_live_and_unions_are_views():
    """A trait declared after import (a dialect op's) is seen through every union built before."""
    leaf = Trait("leaf_for_test", "", [aten.neg.default])
    union = leaf | PERMUTE
    marker = object()
    assert marker not in union
    leaf.add(marker)
    assert marker in union and aten.permute.default in union and aten.neg.default in union
    assert marker in set(union) and len(union) == len(PERMUTE) + 2
    leaf.discard(marker)
    assert marker not in union
    with pytest.raises(TypeError, match="union"):
        union.add(object())
    assert set(VIEW) <= set(MOVEMENT) and set(PERMUTE) <= set(MOVEMENT)


def test_declare_names_unknown_traits():
    with pytest.raises(KeyError):
        op_traits.declare(object(), ["no_such_trait"])


def test_dialect_ops_declare_their_traits():
    """Every ``circle::`` op is defined through the dialect with its traits stated (possibly none)."""
    from circle_fx import dialect

    ops = dialect.ops()
    assert {"rms_norm", "rope", "linear_act", "silu", "conv2d_nhwc", "q_linear", "linear_w8", "linear_ggml"} <= set(ops)
    assert ops["silu"].traits == ("elementwise",) and ops["silu"].target in ELEMENTWISE
    assert all(o.target in ELEMENTWISE for o in ops.values() if "elementwise" in o.traits)
    assert ops["rms_norm"].target not in ELEMENTWISE  # a row-wise reduction, not elementwise
