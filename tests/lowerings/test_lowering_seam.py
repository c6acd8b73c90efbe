"""Lowerings use only the LoweringContext seam: no program/graph module, no builder
internals, no private names of circle_fx objects (so the builder and Program can change
without touching ~15 lowering files). Checked on the source, so it stays that way.

The lowerings checked are the registry's (``emit.registry.LOWERINGS``), wherever they are
defined: a module that only holds lowerings (``emit/lowerings/``, ``quant/lowerings/``) is
checked whole; in a fusion family's module, which also holds rules that read the graph, the
lowering function and the module's functions it calls are.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import pathlib

import circle_fx
from circle_fx.emit.registry import LOWERINGS, builtin_targets

circle_fx.load_compiler()  # builtin_targets sees only what is registered; import circle_fx is lazy

#: attributes a lowering must not read, on anything (ctx internals and raw FX metadata)
FORBIDDEN_ATTRS = {"program", "builder", "values", "gm", "meta", "tensors", "buffers", "operators"}
#: names a lowering must not use (reach around ctx for constants, shapes or the builder)
FORBIDDEN_NAMES = {"fetch_attr", "ModelBuilder", "LoweringContext", "static_shape", "shape_of"}
#: modules whose private names are torch's own API spelling (aten._softmax, ...), not ours
TORCH_BASES = {"aten", "torch", "operator", "pc"}


def violations(path: pathlib.Path, only: set[str] | None = None) -> list[str]:
    """Seam violations in ``path``; ``only``: the names of the module-level functions to check
    (None: the whole module)."""
    tree = ast.parse(path.read_text())
    roots = [tree] if only is None else [f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name in only]
    out = []
    for n in (n for root in roots for n in ast.walk(root)):
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


def _reachable(tree: ast.Module, names: set[str]) -> set[str]:
    """``names`` and the module-level functions they call, transitively."""
    defs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    todo, seen = list(names), set()
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        todo += [n.id for n in ast.walk(defs[name]) if isinstance(n, ast.Name)]
    return seen


def checked_sources() -> dict[pathlib.Path, set[str] | None]:
    """Every built-in lowering's file -> the functions to check there (None: the whole file)."""
    out: dict[pathlib.Path, set[str] | None] = {}
    by_module: dict[str, set[str]] = {}
    for t in builtin_targets():
        fn = LOWERINGS[t]
        by_module.setdefault(fn.__module__, set()).add(fn.__name__)
    for module, names in by_module.items():
        path = pathlib.Path(inspect.getsourcefile(importlib.import_module(module)))
        whole = ".lowerings." in module
        out[path] = None if whole else _reachable(ast.parse(path.read_text()), names)
    return out


def test_lowerings_use_only_the_context_seam():
    sources = checked_sources()
    folders = {p.parent.relative_to(pathlib.Path(circle_fx.__file__).parent).as_posix() for p in sources}
    assert {"emit/lowerings", "quant/lowerings", "fusions"} <= folders, folders
    found = [v for path, only in sorted(sources.items()) for v in violations(path, only)]
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


def test_a_family_module_is_checked_from_its_lowering(tmp_path):
    """In a family's file the rules may read the graph; the lowering and its helpers may not."""
    family = tmp_path / "family.py"
    family.write_text("def rule(m):\n    return m.root.meta\n"
                      "def lower(ctx, node):\n    return helper(node)\n"
                      "def helper(node):\n    return node.meta['val']\n")
    tree = ast.parse(family.read_text())
    only = _reachable(tree, {"lower"})
    assert only == {"lower", "helper"}
    found = violations(family, only)
    assert found == ["family.py:6: .meta"], found
