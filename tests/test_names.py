"""Every name once (issue 19): the Prometheus series, recording rules and alerts are spelled in
dpobs_otel/names.py and nowhere else in the package; the series there are the ones a real
/metrics serves; its lists match contract.yml; and the per-process rules group by its
process identity."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml
from helpers.workload import exercise, series_names

import dpobs_otel as dpobs
from dpobs_otel import names

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "dpobs_otel"
NAMES = PKG / "names.py"
# An f-string's holes read as this, so f"dpobs_guard_rows_{kind}_total" still looks like a name,
# and so does f"job_op:{series}:mean_rate5m" (a rule name assembled around a series).
HOLE = "x"
RULE = re.compile(rf"[a-z_]+:(dpobs_[a-z0-9_]+|{HOLE}):[a-z0-9_]+")
ALERT = re.compile(r"\bDpobs[A-Z]\w+")
SERIES = re.compile(r"\bdpobs_[a-z0-9_]*_(seconds|bytes|total|keys)\b")



def _strings(tree: ast.AST):
    """(line, text) of every string the module computes with: plain literals and f-strings
    (holes filled), not docstrings, which only talk about names."""
    docs = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    pieces = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
              for v in node.values}  # read once, as the whole f-string
    skip = docs | pieces
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else HOLE
                                       for v in node.values)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in skip):
            yield node.lineno, node.value


def literals(path: Path) -> list[tuple[int, str]]:
    """(line, name) for each name the module spells out."""
    return [(line, m.group(0)) for line, text in _strings(ast.parse(path.read_text()))
            for pattern in (RULE, ALERT, SERIES) for m in [pattern.search(text)] if m]


def _modules() -> list[Path]:
    return [p for p in sorted(PKG.rglob("*.py")) if p != NAMES]


def test_no_module_but_names_spells_a_name_out():
    found = [f"{path.relative_to(REPO)}:{line}: {name}"
             for path in _modules() for line, name in literals(path)]
    assert not found, "use the constants of dpobs_otel/names.py:\n" + "\n".join(found)


def test_the_scan_sees_literals_f_strings_and_not_docstrings(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('"""job:dpobs_frac_of_step:ratio_rate5m in a docstring is prose."""\n'
                       'A = "job:dpobs_frac_of_step:ratio_rate5m"\n'
                       'B = f"sum({x}) by DpobsTargetDown"\n'
                       'C = f"dpobs_guard_rows_{kind}_total"\n'
                       'D = f"job_op:{series}:mean_rate5m"\n')
    assert literals(planted) == [(2, "job:dpobs_frac_of_step:ratio_rate5m"),
                                 (3, "DpobsTargetDown"), (4, "dpobs_guard_rows_x_total"),
                                 (5, "job_op:x:mean_rate5m")]


# -- names.py against what is served, generated and pinned --------------------------------
# Every histogram row's series (its native View's family is served apart, as one name)
HISTOGRAMS = {names.instrument_series(row.name) for row in names.INSTRUMENTS.values()
              if row.kind == names.HISTOGRAM}
CONTRACT = yaml.safe_load((REPO / "contract.yml").read_text())


def _constants(pattern: re.Pattern) -> set[str]:
    return {v for k, v in vars(names).items()
            if k.isupper() and isinstance(v, str) and pattern.fullmatch(v)}


def _series_samples() -> set[str]:
    """What a Prometheus sees of names.py's series: a histogram's three sample names."""
    out = set()
    for k, v in vars(names).items():
        if k.endswith("_SERIES"):
            out |= {f"{v}_{s}" for s in ("bucket", "sum", "count")} if v in HISTOGRAMS else {v}
    return out


def test_series_are_what_the_exporter_serves():
    tel = dpobs.start(role="names", rank=0, job="names", verify_tensor_hash=True)
    try:
        exercise(tel)
        served = {s for s in series_names(tel) if s.startswith("dpobs_")}
    finally:
        tel.shutdown()
    assert served, "the workload exported nothing"
    assert served <= _series_samples(), sorted(served - _series_samples())


def _contract(category: str) -> tuple[set[str], set[str]]:
    """(built, all) names of a contract.yml category: names.py holds every built one, and a
    pending one once its issue defines it."""
    entries = CONTRACT[category]
    return {n for n, s in entries.items() if s == "built"}, set(entries)


def test_names_hold_the_contracts_series_rules_and_alerts():
    unpinned = names.UNPINNED_RECORDS
    for category, held in (("series", _series_samples()),
                           ("records", _constants(RULE) - unpinned),
                           ("alerts", _constants(ALERT))):
        built, listed = _contract(category)
        assert built <= held <= listed, (category, sorted(built - held), sorted(held - listed))


def _groupings(expr: str) -> list[tuple[str, ...]]:
    return [tuple(x.strip() for x in m.split(",")) for m in re.findall(r"by \(([^)]*)\)", expr)]


@pytest.mark.parametrize("level, extra", [("instance", ()), ("instance_op", ("op",))])
def test_per_process_rules_group_by_the_process_identity(level, extra):
    path = REPO / "deploy/prometheus/rules/dpobs-recording.rules.yml"
    rules = [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]
             if r.get("record", "").split(":")[0] == level]
    if level == "instance":
        assert rules, "no per-process rule in the generated file"
    for r in rules:
        assert _groupings(r["expr"]), r["record"]
        for labels in _groupings(r["expr"]):
            assert labels == (*names.PROCESS_IDENTITY, *extra), (r["record"], labels)
