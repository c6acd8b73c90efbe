"""Lowerings use only the LoweringContext seam: no program/graph module, no builder
internals, no private names of circle_fx objects (so the builder and Program can change
without touching ~15 lowering files). Checked on the source, so it stays that way."""
from __future__ import annotations

import ast
import pathlib

import circle_fx

LOWERINGS = pathlib.Path(circle_fx.__file__).parent / "emit" / "lowerings"

#: attributes a lowering must not read, on anything (ctx internals and raw FX metadata)
FORBIDDEN_ATTRS = {"program", "builder", "values", "gm", "meta", "tensors", "buffers", "operators"}
#: names a lowering must not use (reach around ctx for constants, shapes or the builder)
FORBIDDEN_NAMES = {"fetch_attr", "ModelBuilder", "LoweringContext", "static_shape", "shape_of"}
#: modules whose private names are torch's own API spelling (aten._softmax, ...), not ours
TORCH_BASES = {"aten", "torch", "operator", "pc"}


def violations(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for n in ast.walk(tree):
        where = f"{path.name}:{getattr(n, 'lineno', '?')}"
        if isinstance(n, ast.Attribute):
            if n.attr in FORBIDDEN_ATTRS:
                out.append(f"{where}: .{n.attr}")
            root = n.value
            while isinstance(root, ast.Attribute):
                root = root.value
            base = root.id if isinstance(root, ast.Name) else None
            if n.attr.startswith("_") and base not in TORCH_BASES:
                out.append(f"{where}: private .{n.attr}")
        elif isinstance(n, ast.Name) and n.id in FORBIDDEN_NAMES:
            out.append(f"{where}: {n.id}")
        elif isinstance(n, ast.ImportFrom):
            for a in n.names:
                if a.name in FORBIDDEN_NAMES:
                    out.append(f"{where}: imports {a.name}")
            if n.module and n.module.split(".")[-1] in ("program", "builder", "context", "emitter", "writer"):
                out.append(f"{where}: imports from {n.module}")
    return out


def test_lowerings_use_only_the_context_seam():
    files = sorted(LOWERINGS.glob("*.py"))
    assert len(files) > 5
    found = [v for f in files for v in violations(f)]
    assert not found, "lowerings reaching around LoweringContext:\n  " + "\n  ".join(found)


def test_the_check_catches_each_kind(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from ...program import fetch_attr\n"
                   "def f(ctx, node):\n"
                   "    ctx.builder.tensors[0]; ctx.program.gm; ctx._prefix(); node.meta['val']\n"
                   "    torch.ops.aten._softmax.default\n")
    found = "\n".join(violations(bad))
    for word in ("imports fetch_attr", ".builder", ".program", "private ._prefix", ".meta", ".tensors"):
        assert word in found, (word, found)
    assert "_softmax" not in found
