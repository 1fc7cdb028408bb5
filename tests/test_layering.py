"""The import order of docs/architecture.md "Order of rooms", read from every import (ast).

A room imports only rooms below it; no module imports itself back through others (deferred
imports inside functions count: they are cycles all the same); the library never imports the
CLI or a test fixture module.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "astrai"

# Lowest first; a room may import rooms of a lower rank only. Read from docs/architecture.md.
ORDER_DOC = ROOT / "docs" / "architecture.md"
FIXTURES = {"astrai.data.testing", "astrai.inspect.testing"}


def room_order() -> dict[str, int]:
    text = ORDER_DOC.read_text()
    section = text.split("## Order of rooms", 1)[1].split("\n## ", 1)[0]
    ranks = {}
    for line in section.splitlines():
        m = re.match(r"^\|\s*(\d+)\s*\|([^|]+)\|", line)
        if m:
            for room in re.findall(r"`([a-z_]+)/?`", m.group(2)):
                ranks[room] = int(m.group(1))
    assert ranks, "docs/architecture.md has no 'Order of rooms' table"
    return ranks


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[str, int]]:
    """(imported astrai module, line) for every import in the file, deferred ones included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found += [(f"{base}.{a.name}", node.lineno) for a in node.names]
            found.append((base, node.lineno))
    return [(m, n) for m, n in found if m.split(".")[0] in ("astrai", "astrai_cli")]


def known_module(name: str, modules: set[str]) -> str | None:
    """The longest prefix of `name` that is a module of the library (a name may be a symbol)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "astrai"


def graph() -> dict[str, dict[str, int]]:
    files = {module_name(p): p for p in LIB.rglob("*.py")}
    edges: dict[str, dict[str, int]] = {}
    for mod, path in files.items():
        out = edges.setdefault(mod, {})
        for name, line in imports(path):
            if name.startswith("astrai_cli"):
                out[name] = line
                continue
            target = known_module(name, set(files))
            # a module's own parent packages run before it whatever it imports: no edge
            if target and target != mod and not mod.startswith(target + "."):
                out.setdefault(target, line)
    return edges


def test_rooms_import_only_rooms_below_them():
    ranks = room_order()
    edges = graph()
    rooms = {room(m) for m in edges} - {"astrai"}
    assert rooms <= set(ranks), f"rooms missing from the order: {sorted(rooms - set(ranks))}"
    bad = []
    for mod, out in edges.items():
        for target, line in out.items():
            a, b = room(mod), room(target)
            if target.startswith("astrai_cli") or target in FIXTURES and mod not in FIXTURES:
                bad.append(f"{mod}:{line} imports {target}")
            elif a != b and a != "astrai" and ranks[b] >= ranks[a]:
                bad.append(f"{mod}:{line} ({a}, rank {ranks[a]}) imports {target} "
                           f"({b}, rank {ranks[b]})")
    assert not bad, "imports against docs/architecture.md's order:\n" + "\n".join(sorted(bad))


def test_no_import_cycles_between_modules():
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, {}):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)
