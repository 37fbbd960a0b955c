"""The code's shape, held where a review found it slipping: no import circle, no family facts read off a config
outside the families, and no class or module too long to read."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import grimp

PACKAGE = Path(__file__).resolve().parents[1] / "kvviz"
MAX_CLASS_LINES = 300
MAX_MODULE_LINES = 400


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in edges:
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_through_others():
    graph = grimp.build_graph("kvviz")
    modules = set(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & modules for m in sorted(modules)}
    assert _circles(edges) == []


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_hasattr_or_getattr_on_a_model_config_outside_the_families():
    pattern = re.compile(r"(hasattr|getattr)\(\s*[\w.]*\b(config|cfg)\b")
    found = [f"{path.relative_to(PACKAGE)}:{n}" for path in PACKAGE.rglob("*.py") if "models" not in path.parts
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert found == []


def test_no_class_over_300_lines_and_no_module_over_400():
    long = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(PACKAGE)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            lines = node.end_lineno - node.lineno + 1 if isinstance(node, ast.ClassDef) else 0
            if lines > MAX_CLASS_LINES:
                long.append(f"{path.relative_to(PACKAGE)}: class {node.name}, {lines} lines")
    assert long == []
