"""The prometheus-operator manifests: generated from the same Config as the rule files,
committed, and current."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dpobs_otel import cli
from dpobs_otel.mixin import kubernetes

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "deploy/kubernetes"
RULES = ROOT / "deploy/prometheus/rules"


def manifest(name: str) -> dict:
    return yaml.safe_load(kubernetes.build_manifests()[name])


def test_committed_manifests_are_current():
    built = kubernetes.build_manifests()
    on_disk = {p.name: p.read_text() for p in COMMITTED.glob("*.yaml")}
    assert set(on_disk) == set(built)
    for name, text in built.items():
        assert on_disk[name] == text, f"{name} is stale: run `make mixin`"


def test_prometheus_rule_carries_the_rule_files_unchanged():
    doc = manifest("dpobs-prometheusrule.yaml")
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    groups = [g for f in sorted(RULES.glob("*.rules.yml")) for g in yaml.safe_load(f.read_text())["groups"]]
    by_name = {g["name"]: g for g in groups}
    assert sorted(by_name) == sorted(g["name"] for g in doc["spec"]["groups"])
    for g in doc["spec"]["groups"]:
        assert g == by_name[g["name"]], g["name"]


def test_prometheus_rule_passes_promtool(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not on PATH; install Prometheus (see .ci/run)")
    rules = tmp_path / "from-prometheusrule.yml"
    rules.write_text(yaml.safe_dump(manifest("dpobs-prometheusrule.yaml")["spec"]))
    proc = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pod_monitor_gives_targets_the_file_sd_labels():
    doc = manifest("dpobs-podmonitor.yaml")
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    (endpoint,) = doc["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    relabel = endpoint["relabelings"]
    assert relabel[0] == {"targetLabel": "job", "replacement": "dpobs", "action": "replace"}
    targets = {r["targetLabel"]: r.get("sourceLabels") for r in relabel[1:]}
    assert targets == {k: [f"__meta_kubernetes_pod_label_dpobs_io_{k}"] for k in ("job", "role", "rank")}
    assert doc["spec"]["selector"] == {
        "matchExpressions": [{"key": "dpobs.io/role", "operator": "Exists"}]}


def test_cli_writes_the_same_files(tmp_path, capsys):
    assert cli.main(["kubernetes", "--out", str(tmp_path)]) == 0
    written = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert written == kubernetes.build_manifests()
    assert capsys.readouterr().out.split() == [str(tmp_path / n) for n in sorted(written)]
