"""The package shows its layers (DESIGN.md "Layout") and the layout page's list
(docs/development/layout.md) names every
module in it, and the package stays readable: short modules and functions, every test module
in the tree that mirrors the package, tests and benchmarks that import what they use by name
(no sys.path edits, no test module imported as a library)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYOUT_PAGE = REPO / "docs" / "development" / "layout.md"
PKG = REPO / "dpobs_otel"
LAYERS = ("exporters", "agent", "readback", "guard", "adapters", "stores", "testing", "mixin",
          "demo", "top", "tracing", "shims")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
# A longer function says why in its docstring, with these words.
EXCUSE = "long because"


def _modules():
    return sorted(PKG.rglob("*.py"))


def test_every_layer_is_a_subpackage():
    for layer in LAYERS:
        assert (PKG / layer / "__init__.py").is_file(), layer
        doc = ast.get_docstring(ast.parse((PKG / layer / "__init__.py").read_text()))
        assert doc, f"{layer}/__init__.py says what the layer is for"
    assert (PKG / "protocol.py").is_file()
    # The core sits at the top; nothing of a layer is left there.
    assert not {"guard.py", "fingerprint.py", "transferqueue.py", "store.py", "demo.py",
                "dashboards.py", "kubernetes.py", "endpoint.py", "filesd.py", "bound.py",
                "sdk_private.py", "nested.py", "asyncio_waits.py"} & {
                    p.name for p in PKG.glob("*.py")}


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_modules_and_functions_stay_short(path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            doc = (ast.get_docstring(node) or "").lower()
            assert length <= MAX_FUNCTION_LINES or EXCUSE in doc, (
                f"{node.name} is {length} lines; split it or say why ({EXCUSE} ...)")


def test_tests_mirror_the_package():
    for layer in LAYERS:
        if layer == "stores" or any((PKG / layer).glob("*.py")):
            assert any((REPO / "tests" / layer).glob("test_*.py")), f"tests/{layer}/"
    names = [p.name for p in (REPO / "tests").rglob("test_*.py")]
    assert len(names) == len(set(names)), "test module names must be unique (no __init__.py)"


def _python_files(*folders: str):
    for folder in folders:
        yield from sorted((REPO / folder).rglob("*.py"))


def _uses_sys_path(tree: ast.AST) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == "path"
               and isinstance(node.value, ast.Name) and node.value.id == "sys"
               for node in ast.walk(tree))


def test_no_code_edits_sys_path():
    # Reading sys.path is as rare as editing it here; either one means an import by path.
    offenders = [str(p.relative_to(REPO)) for p in _python_files("dpobs_otel", "tests", "benchmarks")
                 if _uses_sys_path(ast.parse(p.read_text()))]
    assert not offenders, offenders


def _imported(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def test_tests_import_helpers_not_conftest_or_other_tests():
    for path in _python_files("tests"):
        for mod in _imported(ast.parse(path.read_text())):
            top = mod.split(".")
            assert top[0] != "conftest" and not any(part.startswith("test_") for part in top), (
                f"{path.relative_to(REPO)} imports {mod}")


def test_benchmarks_import_the_library_not_the_tests():
    test_modules = {p.stem for p in (REPO / "tests").rglob("*.py")} | {"helpers", "conftest"}
    for path in _python_files("benchmarks"):
        assert path.stem != "mooncake", "benchmarks/mooncake.py would shadow the mooncake package"
        found = {m.split(".")[0] for m in _imported(ast.parse(path.read_text()))} & test_modules
        assert not found, f"{path.relative_to(REPO)} imports tests' {sorted(found)}"


def test_test_folders_mirror_package_folders():
    for folder in sorted(p for p in (REPO / "tests").rglob("*") if p.is_dir()):
        rel = folder.relative_to(REPO / "tests")
        # tests/cuda holds the CUDA-only tests of every layer in one folder (tests/cuda/conftest.py)
        if rel.parts[0] in ("helpers", "cuda", "__pycache__") or "__pycache__" in rel.parts:
            continue
        assert (PKG / rel).is_dir(), f"tests/{rel} matches no package folder dpobs_otel/{rel}"


def _readme_layout() -> dict[str, set[str]]:
    """The layout page's list (docs/development/layout.md, once README's) as {folder under dpobs_otel/, "" for the top: its modules named}.
    A line at six spaces opens an entry: a folder (`guard/`, `adapters/verl/`), or the top level
    when its first word is not one; deeper lines continue the entry. Its modules are the bare
    `name.py` words (a path such as guard/reference.py points elsewhere and is not counted)."""
    section = LAYOUT_PAGE.read_text().split("# Layout\n", 1)[1].split("\n## ", 1)[0]
    listed: dict[str, set[str]] = {}
    folder = None
    for line in section.split("\n    dpobs_otel/\n", 1)[1].splitlines():
        indent = len(line) - len(line.lstrip())
        if indent < 6:
            break
        if indent == 6:
            first = line.split()[0]
            folder = first.rstrip("/") if first.endswith("/") else ""
        listed.setdefault(folder, set()).update(
            re.findall(r"(?<![\w/.*-])([a-z_][a-z0-9_]*)\.py\b", line))
    return listed


def _package_layout() -> dict[str, set[str]]:
    """Every package under dpobs_otel/ ("" for the top) with its modules, __init__ aside."""
    out = {}
    for init in PKG.rglob("__init__.py"):
        folder = init.parent.relative_to(PKG).as_posix()
        out["" if folder == "." else folder] = {
            p.stem for p in init.parent.glob("*.py") if p.name != "__init__.py"}
    return out


def test_the_readme_layout_lists_every_module_and_only_those():
    listed, found = _readme_layout(), _package_layout()
    assert set(listed) == set(found), (
        f"packages missing from the layout page: {sorted(set(found) - set(listed))}; "
        f"listed but not on disk: {sorted(set(listed) - set(found))}")
    for folder in sorted(found):
        where = f"dpobs_otel/{folder}/" if folder else "dpobs_otel/ (the top level)"
        assert found[folder] <= listed[folder], (
            f"{where}: the layout page misses {sorted(found[folder] - listed[folder])}")
        assert listed[folder] <= found[folder], (
            f"{where}: the layout page lists {sorted(listed[folder] - found[folder])}, not on disk")
