"""Every function of the library reads on one screen: none is longer than 80 lines
(docs/architecture.md; the CLI's command functions and tests are not held to it)."""

from __future__ import annotations

import ast
from pathlib import Path

LIB = Path(__file__).resolve().parents[1] / "astrai"
MAX_LINES = 80


def long_functions(root: Path, limit: int) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} "
                                 f"{node.name} ({n} lines)")
    return found


def test_no_library_function_is_longer_than_a_screen():
    assert not long_functions(LIB, MAX_LINES)


def test_the_check_finds_a_long_function(tmp_path):
    pkg = tmp_path / "astrai"
    pkg.mkdir()
    (pkg / "m.py").write_text("def f():\n" + "    x = 1\n" * 81)
    assert long_functions(pkg, MAX_LINES) == ["astrai/m.py:1 f (82 lines)"]


STATELESS_ROOMS = ("model", "infer")
"""Rooms whose state lives in objects (an engine, its ForwardContext), never in the process:
two engines in one process must not see each other's kernels or adapter selections."""


def process_globals(root: Path) -> list[str]:
    """Every `global` statement (a function rebinding module state) under `root`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Global):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} "
                             f"global {', '.join(node.names)}")
    return found


def test_model_and_infer_keep_no_process_global_state():
    assert not [g for room in STATELESS_ROOMS for g in process_globals(LIB / room)]


def test_the_check_finds_a_global_slot(tmp_path):
    pkg = tmp_path / "astrai"
    pkg.mkdir()
    (pkg / "m.py").write_text("_k = None\n\ndef f(k):\n    global _k\n    _k = k\n")
    assert process_globals(pkg) == ["astrai/m.py:4 global _k"]
