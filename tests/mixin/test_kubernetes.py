"""The prometheus-operator manifests: generated from the same Config as the rule files,
committed, and current."""
from __future__ import annotations

import argparse
import dataclasses
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from dpobs_otel import cli
from dpobs_otel.config import Settings
from dpobs_otel.agent import command as agent
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
        assert on_disk[name] == text, f"{name} is stale: run `dpobs mixin --out deploy --dashboards-out dashboards`"


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


# --- core objects: validated offline against the Kubernetes schemas --------------------

CORE = ["dpobs-sidecar-job.yaml", "dpobs-agent-daemonset.yaml", "dpobs-daemonset-job.yaml"]
VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]  # native sidecars: 1.29+


@pytest.mark.parametrize("name", CORE)
@pytest.mark.parametrize("version", VERSIONS)
def test_core_objects_validate(name, version):
    kubernetes_validate.validate(manifest(name), version, strict=True)


def test_validator_rejects_a_typo():
    """The premise of the test above: strict validation does reject a wrong field."""
    doc = manifest("dpobs-sidecar-job.yaml")
    doc["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, VERSIONS[0], strict=True)


# --- custom resources: checked against the fields the prometheus-operator documents -----
# (monitoring.coreos.com/v1 API reference: PodMonitorSpec, PodMetricsEndpoint,
# RelabelConfig, PrometheusRuleSpec, RuleGroup, Rule). kubernetes-validate has no schemas
# for CRDs. A field spec is {name: type}; required names end with "!".

RELABEL = {"sourceLabels": [str], "separator": str, "targetLabel": str, "regex": str,
           "modulus": int, "replacement": str, "action": str}
ENDPOINT = {"port": str, "portNumber": int, "path": str, "scheme": str, "params": dict,
            "interval": str, "scrapeTimeout": str, "honorLabels": bool,
            "honorTimestamps": bool, "relabelings": [RELABEL], "metricRelabelings": [RELABEL],
            "tlsConfig": dict, "basicAuth": dict, "authorization": dict, "proxyUrl": str,
            "followRedirects": bool, "enableHttp2": bool, "filterRunning": bool}
SELECTOR = {"matchLabels": dict, "matchExpressions": [{"key!": str, "operator!": str,
                                                       "values": [str]}]}
METADATA = {"name!": str, "namespace": str, "labels": dict, "annotations": dict}
POD_MONITOR = {"apiVersion!": str, "kind!": str, "metadata!": METADATA, "spec!": {
    "selector!": SELECTOR, "podMetricsEndpoints": [ENDPOINT], "namespaceSelector": dict,
    "jobLabel": str, "podTargetLabels": [str], "sampleLimit": int, "targetLimit": int,
    "attachMetadata": dict}}
RULE = {"record": str, "alert": str, "expr!": str, "for": str, "keep_firing_for": str,
        "labels": dict, "annotations": dict}
PROMETHEUS_RULE = {"apiVersion!": str, "kind!": str, "metadata!": METADATA, "spec!": {
    "groups": [{"name!": str, "interval": str, "rules!": [RULE], "limit": int,
                "partial_response_strategy": str}]}}
ACTIONS = {"replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep",
           "lowercase", "uppercase", "keepequal", "dropequal"}


def check(value, spec, where: str = "") -> None:
    if isinstance(spec, list):
        assert isinstance(value, list), f"{where}: not a list"
        for i, item in enumerate(value):
            check(item, spec[0], f"{where}[{i}]")
    elif isinstance(spec, dict):
        assert isinstance(value, dict), f"{where}: not an object"
        fields = {k.rstrip("!"): v for k, v in spec.items()}
        unknown = set(value) - set(fields)
        assert not unknown, f"{where}: fields the operator does not document: {unknown}"
        missing = {k.rstrip("!") for k in spec if k.endswith("!")} - set(value)
        assert not missing, f"{where}: required fields missing: {missing}"
        for k, v in value.items():
            check(v, fields[k], f"{where}.{k}")
    else:
        assert isinstance(value, spec), f"{where}: {value!r} is not {spec.__name__}"


def test_pod_monitor_has_only_documented_fields():
    doc = manifest("dpobs-podmonitor.yaml")
    check(doc, POD_MONITOR, "PodMonitor")
    for r in doc["spec"]["podMetricsEndpoints"][0]["relabelings"]:
        assert r["action"].lower() in ACTIONS


def test_prometheus_rule_has_only_documented_fields():
    doc = manifest("dpobs-prometheusrule.yaml")
    check(doc, PROMETHEUS_RULE, "PrometheusRule")
    for g in doc["spec"]["groups"]:
        for r in g["rules"]:
            assert ("record" in r) != ("alert" in r), r


def test_structural_check_rejects_an_undocumented_field():
    doc = manifest("dpobs-podmonitor.yaml")
    doc["spec"]["podMetricsEndpoints"][0]["relabelling"] = []
    with pytest.raises(AssertionError, match="relabelling"):
        check(doc, POD_MONITOR, "PodMonitor")


def test_pod_monitor_says_it_is_for_one_rank_pods():
    text = kubernetes.build_manifests()["dpobs-podmonitor.yaml"]
    assert "ONE rank" in text.split("apiVersion")[0]


# --- the workloads: what the agent and the ranks must agree on ---------------------------

def pod(name: str) -> dict:
    return manifest(name)["spec"]["template"]["spec"]


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def mounts(container: dict) -> dict:
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


def agent_args(container: dict) -> argparse.Namespace:
    """The container's command, parsed by the real `dpobs agent` parser and turned into a
    config by the real renderer (no binary started)."""
    command = container["command"]
    assert command[:2] == ["dpobs", "agent"]
    parser = argparse.ArgumentParser()
    agent.add_arguments(parser)
    args = parser.parse_args([a.replace("$(NODE_NAME)", "node-x") for a in command[2:]])
    agent.config_from_args(args)  # raises on anything the agent would refuse
    return args


def test_dpobs_env_names_are_settings():
    known = {"DPOBS_" + f.name.upper() for f in dataclasses.fields(Settings)}
    for name in CORE:
        for c in pod(name).get("initContainers", []) + pod(name)["containers"]:
            used = {k for k in env_of(c) if k.startswith("DPOBS_")}
            assert used <= known, (name, c["name"], used - known)


def test_sidecar_shares_file_sd_on_loopback():
    spec = pod("dpobs-sidecar-job.yaml")
    (side,), (trainer,) = spec["initContainers"], spec["containers"]
    assert side["restartPolicy"] == "Always"  # native sidecar: the Job still completes
    args = agent_args(side)
    assert args.node == "node-x" and args.remote_write.endswith("/api/v1/write")
    assert env_of(side)["NODE_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    sd = env_of(trainer)["DPOBS_SD_DIR"]
    assert args.sd_dir == sd
    assert mounts(side)["file-sd"] == mounts(trainer)["file-sd"] == sd
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["file-sd"]
    assert "DPOBS_HOST" not in env_of(trainer)  # the default: 127.0.0.1
    # file_sd files are 0600: both containers run as one user
    assert spec["securityContext"]["runAsUser"] == spec["securityContext"]["runAsGroup"]


def test_daemonset_reads_the_directory_the_ranks_advertise_pod_ips_in():
    ds, job = pod("dpobs-agent-daemonset.yaml"), pod("dpobs-daemonset-job.yaml")
    (agent_c,), (trainer,) = ds["containers"], job["containers"]
    args = agent_args(agent_c)
    assert env_of(agent_c)["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    host = {v["name"]: v.get("hostPath", {}).get("path") for v in ds["volumes"]}
    host_job = {v["name"]: v.get("hostPath", {}).get("path") for v in job["volumes"]}
    assert host["file-sd"] == host_job["file-sd"] is not None
    env = env_of(trainer)
    assert args.sd_dir == mounts(agent_c)["file-sd"]
    assert env["DPOBS_SD_DIR"] == mounts(trainer)["file-sd"]
    assert env["DPOBS_HOST"] == "0.0.0.0"
    assert env["DPOBS_ADVERTISE_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    # reachable from the pod network, so mutual TLS: the ranks demand a client cert the
    # agent presents, and the agent verifies the ranks against the same CA
    assert {"DPOBS_TLS_CERTFILE", "DPOBS_TLS_KEYFILE", "DPOBS_TLS_CLIENT_CAFILE"} <= env.keys()
    assert args.scrape_ca_file and args.scrape_cert_file and args.scrape_key_file
    assert mounts(agent_c)["tls"] == mounts(trainer)["tls"]
