"""Every ``node.meta`` / ``gm.meta`` key circle_fx writes is named in ``circle_fx/meta.py``.

A bare string key written in one module and read in another is a side channel nobody can
find; named in meta.py, writer and reader share one constant. Only the keys torch (and
torchao's quantizer protocol) define may be spelled as literals.
"""
from __future__ import annotations

import ast
import dataclasses
import pathlib

import circle_fx
from circle_fx import meta
from circle_fx.program import Program

PKG = pathlib.Path(circle_fx.__file__).parent
#: torch's own keys (and torchao's ``quantization_annotation``)
THEIRS = {"val", "tensor_meta", "stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "from_node",
          "example_value", "unbacked_bindings", "quantization_annotation"}


def _literal_keys(tree: ast.AST):
    """String literals used as keys of something's ``.meta``: ``x.meta["k"]``, ``x.meta.get("k")``..."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "meta":
            key = node.slice
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "setdefault", "pop") and isinstance(node.func.value, ast.Attribute)
              and node.func.value.attr == "meta" and node.args):
            key = node.args[0]
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            yield node.lineno, key.value


def test_meta_keys_are_named_in_meta_py():
    bad = [f"{p.relative_to(PKG)}:{line}: {key!r}" for p in sorted(PKG.rglob("*.py"))
           for line, key in _literal_keys(ast.parse(p.read_text())) if key not in THEIRS]
    assert not bad, "meta keys spelled as literals (name them in circle_fx/meta.py):\n" + "\n".join(bad)


def test_the_checker_sees_a_literal_key():
    found = list(_literal_keys(ast.parse("n.meta['circle_fx.x'] = 1\ny = gm.meta.get('k', 0)\nz = n.meta[KEY]")))
    assert found == [(1, "circle_fx.x"), (2, "k")]


def test_meta_py_keys_are_distinct_and_namespaced():
    keys = {k: v for k, v in vars(meta).items() if k.isupper() and isinstance(v, str)}
    assert len(set(keys.values())) == len(keys), keys
    assert all(v.startswith("circle_fx.") for v in keys.values()), keys


def test_program_keeps_typed_records_not_a_notes_dict():
    fields = {f.name for f in dataclasses.fields(Program)}
    assert "notes" not in fields
    assert {"implementations", "qdq_notes", "quantization", "limits"} <= fields
