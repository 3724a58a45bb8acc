"""contract.yml is the repository's one list of the names ../shared/DESIGN.md pins, each built
or pending with the issue that builds it. Every built name must exist in what the package
generates or serves; where DESIGN.md is beside the checkout (under CI it must be), the list
must hold exactly its names, so a name DESIGN.md adds or drops fails here until listed."""
from __future__ import annotations

import importlib.util
import inspect
import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
import yaml
from tensordict import TensorDict

import dpobs_otel as dpobs
from helpers import IN_CI, design
from helpers.workload import exercise, series_names

REPO = Path(__file__).resolve().parents[1]
CONTRACT = yaml.safe_load((REPO / "contract.yml").read_text())
STATUS = re.compile(r"built|pending (\d+)")


def _built(category: str) -> list[str]:
    return sorted(n for n, s in CONTRACT[category].items() if s == "built")


def test_every_entry_is_built_or_pending_with_its_issue():
    for category, entries in CONTRACT.items():
        for name, status in entries.items():
            assert STATUS.fullmatch(str(status)), f"{category}: {name}: {status!r}"


def test_the_list_holds_exactly_the_names_design_md_pins():
    if not design.DESIGN.exists():
        if IN_CI:
            pytest.fail(f"{design.DESIGN} is missing under CI: the contract cannot be read")
        pytest.skip(f"{design.DESIGN} is not beside this clone; the list alone is checked")
    pinned = design.names()
    assert set(CONTRACT) == set(pinned)
    for category, names in pinned.items():
        listed = set(CONTRACT[category])
        assert listed == names, (f"{category}: missing from contract.yml {sorted(names - listed)}, "
                                 f"not in DESIGN.md {sorted(listed - names)}")


def _rules() -> tuple[set[str], set[str]]:
    records, alerts = set(), set()
    for path in (REPO / "deploy" / "prometheus" / "rules").glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            records |= {r["record"] for r in group["rules"] if "record" in r}
            alerts |= {r["alert"] for r in group["rules"] if "alert" in r}
    return records, alerts


def test_built_rules_and_alerts_are_generated():
    records, alerts = _rules()
    assert set(_built("records")) <= records
    assert set(_built("alerts")) <= alerts


def test_built_dashboards_are_generated():
    uids = {json.loads(p.read_text())["uid"] for p in (REPO / "dashboards").glob("*.json")}
    assert set(_built("dashboards")) <= uids


def _help(*argv: str) -> str:
    r = subprocess.run([sys.executable, "-m", "dpobs_otel.cli", *argv, "--help"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"dpobs {' '.join(argv)} --help: {r.stderr[-2000:]}"
    return r.stdout


@pytest.mark.parametrize("command", _built("commands"))
def test_built_commands_answer_help(command):
    _help(command)


def test_built_demo_flags_are_accepted():
    text = _help("demo")
    for flag in _built("demo_flags"):
        assert re.search(rf"(^|\s){re.escape(flag)}\b", text), flag


@pytest.mark.parametrize("module", _built("modules"))
def test_built_modules_import(module):
    assert importlib.util.find_spec(module) is not None


@pytest.fixture(scope="module")
def exercised():
    tel = dpobs.start(role="contract", rank=0, port=0, verify_tensor_hash=True, row_age=True)
    exercise(tel)
    yield tel
    tel.shutdown()


def test_built_series_are_served(exercised):
    names = series_names(exercised)
    assert set(_built("series")) <= names, sorted(set(_built("series")) - names)


def test_built_api_exists(exercised):
    params = inspect.signature(dpobs.start).parameters
    for name in _built("api"):
        if name.startswith("start("):
            assert name[len("start("):-2] in params, name
        else:
            assert hasattr(exercised, name[len("tel."):]), name


def _one_op(tel) -> None:
    store = dpobs.InMemoryDataPlane()
    store.register_partition("p")
    client = tel.instrument(store)
    client.list_sample_ids("p")
    client.put_samples(["r"], "p", TensorDict({"x": torch.zeros(1)}, [1]))
    client.get_samples(["r"], "p")  # a row read back: row age's keys have a value


def test_built_step_metrics_keys_are_reported():
    tel = dpobs.start(role="contract", rank=0, port=0, row_age=True)
    try:
        with tel.step():
            _one_op(tel)
        keys = set(tel.step_metrics())
    finally:
        tel.shutdown()
    assert set(_built("step_metrics")) <= keys


def test_built_cluster_view_keys_are_reported(tmp_path):
    tel = dpobs.start(role="contract", rank=0, port=0, sd_dir=str(tmp_path), row_age=True)
    try:
        tel.cluster_step_metrics(str(tmp_path))
        with tel.step():
            _one_op(tel)
        keys = set(tel.cluster_step_metrics(str(tmp_path)))
    finally:
        tel.shutdown()
    assert {f"dpobs/cluster/{k}" for k in _built("cluster_view")} <= keys


def test_built_env_variables_are_read():
    source = "\n".join(p.read_text() for p in (REPO / "dpobs_otel").rglob("*.py"))
    for var in _built("env"):
        assert f'"{var}"' in source, var


def test_built_spans_are_in_a_traced_process_ring():
    tel = dpobs.start(role="contract", rank=0, port=0, trace=True)
    try:
        exercise(tel)
        if "dpobs.wait" in _built("spans"):
            with tel.step(), tel.waiting():
                pass
        with urllib.request.urlopen(f"http://{tel.endpoint}/trace", timeout=10) as r:
            spans = {s["name"] for s in json.load(r)["spans"]}
    finally:
        tel.shutdown()
    for name in _built("spans"):
        if name == "dpobs.<op>":
            assert {f"dpobs.{op}" for op in ("put", "get", "list", "clear")} <= spans, spans
        else:
            assert name in spans, (name, spans)
