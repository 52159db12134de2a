"""No import loop in planner/, runtime/ or profiler/, at any scope.

The graph is read from the source (ast), so an import inside a function counts: it hides a loop,
it does not remove it. A loop is a strongly connected component of more than one module
(Tarjan's algorithm, written out here so the test depends on nothing it checks)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("planner", "runtime", "profiler")


def module_files() -> dict:
    files = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join(parts)] = path
    return files


def import_graph(files: dict) -> dict:
    """module -> the project modules it imports (an imported name resolves to the longest
    module prefix: `from planner.search import Fixed` is an edge to planner.search)."""
    def resolve(name: str):
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in files.items():
        edges = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges |= {resolve(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                edges |= {resolve(f"{base}.{a.name}") for a in node.names}
        graph[name] = edges - {None, name}
    return graph


def loops(graph: dict) -> list:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_loop_finder_finds_a_planted_loop():
    """The finder itself: a loop hidden in a function import is found; a chain is not a loop."""
    assert loops({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_a_function_level_import_is_an_edge(tmp_path, monkeypatch):
    pkg = tmp_path / "planner"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text("def f():\n    from planner.two import g\n")
    (pkg / "two.py").write_text("from . import one\n")
    files = {"planner": pkg / "__init__.py", "planner.one": pkg / "one.py",
             "planner.two": pkg / "two.py"}
    assert loops(import_graph(files)) == [["planner.one", "planner.two"]]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_loop(package):
    graph = import_graph(module_files())
    mine = [c for c in loops(graph) if any(m.split(".")[0] == package for m in c)]
    assert mine == [], f"import loops in {package}/: {mine}"
