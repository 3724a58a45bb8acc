"""No import cycles inside the package, imports inside functions included: a lazy import that
closes a cycle still ties the two modules together, and hides the knot from a reader."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "dpobs_otel"


def _name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node, here: str, is_pkg: bool, modules: set[str]):
    """The package modules one import statement names (a `from` import of a submodule names
    the submodule, of an attribute names the module that holds it)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in modules]
    base = here if is_pkg else here.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    mod = node.module or ""
    if node.level:
        mod = f"{base}.{mod}" if mod else base
    found = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in modules]
    if len(found) < len(node.names) and mod in modules:
        found.append(mod)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PKG.rglob("*.py"))
    # A C extension is a submodule too (setup.py builds each from its .c): `from . import
    # _fast` imports it, not its package's __init__.
    modules = {_name(p) for p in paths} | {_name(p) for p in PKG.rglob("*.c")}
    graph = {}
    for path in paths:
        here = _name(path)
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= set(_targets(node, here, path.name == "__init__.py", modules))
        graph[here] = edges - {here}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_detector_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_relative_and_lazy_imports_are_edges():
    graph = import_graph()
    jagged = "dpobs_otel.shims.torch_jagged"
    assert jagged in graph["dpobs_otel.sizing"]  # `from .shims import torch_jagged`
    assert jagged in graph["dpobs_otel.guard.hooks"]  # `from ..shims import torch_jagged`
    # `from .exporters import native_histograms`, inside a function
    assert "dpobs_otel.exporters.native_histograms" in graph["dpobs_otel.telemetry"]
    # `from . import _fast`: the C extension, not the package around it
    assert graph["dpobs_otel.adapters.ray.ops"] >= {"dpobs_otel.adapters.ray._fast"}
    assert "dpobs_otel.adapters.ray" not in graph["dpobs_otel.adapters.ray.ops"]


def test_the_package_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)
