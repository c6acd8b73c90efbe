"""The package import rules of docs/architecture.md hold for every import in circle_fx.

The rules are read from the document itself (the "Packages and what they may import"
section), so the map and the code cannot drift apart: a new dependency is either allowed
there, in writing, or it fails here. Imports inside functions count as much as top-level
ones (a lazy import that runs back up is still a cycle).
"""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "circle_fx"
DOC = ROOT / "docs" / "architecture.md"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _resolve(module: str, path: pathlib.Path, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The circle_fx modules an import statement loads (its target, not the parents)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "circle_fx"]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    if node.level:
        base = package.split(".")[:len(package.split(".")) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != "circle_fx":
        return []
    # ``from pkg import sub`` loads the module pkg.sub; ``from mod import name`` loads mod
    subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
    return subs or [target]


def _imports() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(t for t in _resolve(module, path, node) if t != module)
        edges[module] = found
    return edges


def _unit(module: str) -> str:
    """``circle_fx.emit.lowerings.norm`` -> ``emit``; the root package -> ``circle_fx``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _rules() -> tuple[set[str], dict[str, set[str]]]:
    """(core units, {unit: units it may import}) from the architecture document."""
    text = DOC.read_text()
    section = text[text.index("## Packages and what they may import"):]
    section = section[:section.index("\n## ", 4)]
    core_line = re.search(r"^\*\*Core\*\*:(.*)$", section, flags=re.M)
    assert core_line, "architecture.md: the import rules lost their **Core** line"
    core = set(re.findall(r"`([\w.]+)`", core_line.group(1)))
    rules = {}
    for row in re.findall(r"^\| `circle_fx/([\w]+)(?:/|\.py)` \|.*\|(.*)\|$", section, flags=re.M):
        unit, allowed = row
        rules[unit] = {name.split(".")[0] for name in re.findall(r"`([\w./]+)`", allowed)}
    return core, rules


EDGES = _imports()
CORE, RULES = _rules()
UNITS = {_unit(m) for m in MODULES}


def test_the_document_names_real_modules():
    assert len(RULES) >= 8 and len(CORE) >= 5, (CORE, RULES)
    named = CORE | set(RULES) | {u for allowed in RULES.values() for u in allowed}
    assert not named - UNITS, f"architecture.md names modules circle_fx does not have: {sorted(named - UNITS)}"


def test_core_modules_import_only_core():
    bad = sorted((m, t) for m, ts in EDGES.items() if _unit(m) in CORE
                 for t in ts if _unit(t) not in CORE)
    assert not bad, f"core modules importing outside the core: {bad}"


@pytest.mark.parametrize("unit", sorted(RULES))
def test_package_imports_follow_the_rules(unit):
    allowed = RULES[unit] | CORE | {unit}
    bad = sorted((m, t) for m, ts in EDGES.items() if _unit(m) == unit for t in ts if _unit(t) not in allowed)
    assert not bad, (f"{unit} may import only {sorted(RULES[unit])} and the core (docs/architecture.md), "
                     f"but: {bad}")


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (as a path ending where it starts), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for t in sorted(graph.get(n, ())):
            if state.get(t) == 1:
                return stack[stack.index(t):] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_no_module_import_cycle():
    """Module level; the root package is the public facade that imports everything (lazily
    for export_llm), so edges *into* it are not counted as running back up."""
    graph = {m: {t for t in ts if t != "circle_fx"} for m, ts in EDGES.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_package_import_cycle():
    graph: dict[str, set[str]] = {}
    for m, ts in EDGES.items():
        graph.setdefault(_unit(m), set()).update(_unit(t) for t in ts if _unit(t) not in (_unit(m), "circle_fx"))
    cycle = _cycle(graph)
    assert cycle is None, "package import cycle: " + " -> ".join(cycle)


def test_the_checker_sees_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
