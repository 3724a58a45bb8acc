"""The package shows its layers (DESIGN.md "Layout"), and stays readable: short modules and
functions, every test module in the tree that mirrors the package."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "dpobs_otel"
LAYERS = ("exporters", "guard", "adapters", "stores", "mixin", "demo")
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
                "dashboards.py", "kubernetes.py", "endpoint.py", "filesd.py"} & {
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
