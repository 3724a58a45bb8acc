"""The two-tier layout (mixin/node_tier.py) answers exactly what the one-tier layout does.

promtool evaluates the node rules, then the central rules, then the alerts, over one input:
series of four processes on three nodes, each carrying `node` as the central side sees it
(an agent's or a node Prometheus's external label). The one-tier rules over the same input
are the oracle: a first promtool run with no expectations prints what they record (`got:`,
shortest round-trip floats), and those values, unchanged, are what the one-tier and the
two-tier runs must then both match, sample for sample. The straggler alert is expected by
hand in both. The central rules must never read a family the node does not send, or
promtool (which holds every input series) would hide the gap; a test says so.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers.binaries import run, tool

from dpobs_otel import names as n
from dpobs_otel.mixin import Config
from dpobs_otel.mixin.node_tier import (NOT_SENT, PARTED, central_file, node_file, parts,
                                        used_parts)
from dpobs_otel.mixin.rules import recording_file
from dpobs_otel.mixin.alerts import alerts_file

C = Config()
JOB = "j"
# (node, instance, role, rank); rank 2 of the rollouts is 4x slower per get than the others.
PROCS = [("n1", "127.0.0.1:9000", "rollout", "0"), ("n1", "127.0.0.1:9001", "rollout", "1"),
         ("n2", "127.0.0.1:9000", "rollout", "2"), ("n3", "127.0.0.1:9000", "trainer", "0")]
BOUNDS = ("0.25", "0.5", "1", "+Inf")
COMPARED = (n.JOB_ROLE_OP_SECONDS, n.JOB_OP_SECONDS, n.JOB_SECONDS, n.JOB_STEP_SECONDS,
            n.JOB_FRAC_OF_STEP, n.INSTANCE_FRAC_OF_STEP, n.JOB_MAX_FRAC_OF_STEP,
            n.JOB_BUSY_FRAC_OF_STEP, n.JOB_EXPOSED_FRAC_OF_STEP, n.JOB_MAX_EXPOSED_FRAC_OF_STEP,
            n.JOB_OP_SHARE, n.JOB_OP_RATE, n.JOB_OP_MEAN, n.INSTANCE_OP_MEAN,
            n.JOB_OP_LE_BUCKETS, n.JOB_OP_QUANTILE, n.JOB_OP_ROW_AGE_QUANTILE,
            n.JOB_OP_METHOD_SECONDS, n.JOB_OP_METHOD_RAY_DATA, n.JOB_OP_METHOD_DIRECTION_BYTES,
            n.JOB_OP_METHOD_LOCALITY_RAY_MOVED, n.INSTANCE_RAY_MOVED)
EVAL = "20m"


def _series(metric: str, proc, per_minute: float, **labels) -> dict:
    node, instance, role, rank = proc
    ls = {"job": JOB, "node": node, "instance": instance, "role": role, "rank": rank, **labels}
    body = ",".join(f'{k}="{v}"' for k, v in ls.items())
    return {"series": f"{metric}{{{body}}}", "values": f"0+{per_minute:g}x30"}


def _process(proc) -> list[dict]:
    """Per minute: 60 s of steps; gets of 15 s in 60 calls (0.25 s each, 1 s for the
    straggler), puts of 30 s; busy and exposed time; row age; for the trainer, Ray's get of
    one method with its data time, bytes and locality."""
    slow = proc[3] == "2" and proc[2] == "rollout"
    op, out = n.OP_DURATION_SERIES, [_series(f"{n.STEP_DURATION_SERIES}_sum", proc, 60)]
    out += [_series(f"{op}_sum", proc, 60 if slow else 15, op="get"),
            _series(f"{op}_count", proc, 60, op="get"),
            _series(f"{op}_sum", proc, 30, op="put"),
            _series(f"{op}_count", proc, 60, op="put")]
    below = (0, 0, 60, 60) if slow else (60, 60, 60, 60)
    out += [_series(f"{op}_bucket", proc, k, op="get", le=le) for le, k in zip(BOUNDS, below)]
    out += [_series(n.STEP_BUSY_SERIES, proc, 30), _series(n.STEP_EXPOSED_SERIES, proc, 15)]
    age = n.ROW_AGE_SERIES
    out += [_series(f"{age}_bucket", proc, k, op="get", le=le)
            for le, k in zip(BOUNDS, (15, 45, 60, 60))]
    out += [_series(f"{age}_sum", proc, 30, op="get"), _series(f"{age}_count", proc, 60, op="get")]
    if proc[2] == "trainer":
        ray = {"op": n.RAY_GET, "method": "W.gen"}
        out += [_series(f"{op}_sum", proc, 45, **ray), _series(f"{op}_count", proc, 60, **ray),
                _series(n.RAY_DATA_SERIES, proc, 15, **ray),
                _series(n.TRANSFERRED_SERIES, proc, 6000, direction="read", **ray),
                _series(n.RAY_MOVED_SERIES, proc, 6000, locality="local", **ray)]
    return out


INPUT = [s for p in PROCS for s in _process(p)]


def _layout(tmp_path, name: str, files: dict[str, str]) -> list[str]:
    paths = []
    for fname, text in files.items():
        path = tmp_path / name / fname
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths.append(str(path))
    return paths


def _groups(paths: list[str]) -> list[str]:
    return [g["name"] for p in paths for g in yaml.safe_load(open(p))["groups"]]


def _test_file(tmp_path, name: str, rule_files: list[str], expected: dict[str, list],
               alerts: list[dict]) -> str:
    doc = {"rule_files": rule_files, "evaluation_interval": "1m",
           "group_eval_order": _groups(rule_files),
           "tests": [{"interval": "1m", "input_series": INPUT,
                      "promql_expr_test": [{"expr": e, "eval_time": EVAL, "exp_samples": s}
                                           for e, s in expected.items()],
                      "alert_rule_test": alerts}]}
    path = tmp_path / f"{name}.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def _promtool(path: str) -> tuple[int, str]:
    proc = subprocess.run([tool("promtool"), "test", "rules", path], capture_output=True,
                          text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


GOT = re.compile(r'expr: "(?P<expr>[^"]+)", time: [^\n]*\n\s*exp: [^\n]*\n\s*got: (?P<got>[^\n]*)')
SAMPLE = re.compile(r"\{(?P<labels>[^}]*)\} (?P<value>[^\s,]+)")


def _harvest(out: str) -> dict[str, list]:
    """expr -> exp_samples, from promtool's report of a run that expected nothing."""
    found = {}
    for m in GOT.finditer(out):
        samples = []
        for s in SAMPLE.finditer(m["got"]):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', s["labels"]))
            name = labels.pop("__name__")
            body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            samples.append({"labels": f"{name}{{{body}}}", "value": float(s["value"])})
        found[m["expr"]] = samples
    return found


def _straggler_alert() -> list[dict]:
    labels = {"severity": "warning", "job": JOB, "node": "n2", "instance": "127.0.0.1:9000",
              "role": "rollout", "rank": "2", "op": "get"}
    desc = (f"get calls by rollout rank 2 (127.0.0.1:9000, job {JOB}) take 4x as long on "
            "average as the median of its role's processes.")
    return [{"eval_time": EVAL, "alertname": n.ALERT_STRAGGLER, "exp_alerts": [{
        "exp_labels": labels,
        "exp_annotations": {
            "summary": "One process's data-plane calls are much slower than the rest of its role's.",
            "description": desc, "runbook_url": C.runbook_url(n.ALERT_STRAGGLER)}}]}]


def test_two_tier_answers_equal_one_tier_exactly(tmp_path):
    alerts = alerts_file(C)
    one = _layout(tmp_path, "one", {"recording.rules.yml": recording_file(C),
                                    "alerts.rules.yml": alerts})
    two = _layout(tmp_path, "two", {"node.rules.yml": node_file(C),
                                    "central.rules.yml": central_file(C),
                                    "alerts.rules.yml": alerts})
    rc, out = _promtool(_test_file(tmp_path, "oracle", one, {e: [] for e in COMPARED}, []))
    expected = _harvest(out)
    assert rc != 0 and set(expected) == set(COMPARED), out[-3000:]
    empty = [e for e, s in expected.items() if not s]
    assert not empty, f"the input gives these nothing to compare: {empty}"
    for name, files in (("one", one), ("two", two)):
        rc, out = _promtool(_test_file(tmp_path, name, files, expected, _straggler_alert()))
        assert rc == 0, f"{name}-tier layout:\n{out[-6000:]}"


def test_a_wrong_two_tier_rule_fails_the_comparison(tmp_path):
    """The comparison can fail: a central rule that drops a node's part is caught."""
    part = f"node_{n.JOB_OP_LE_BUCKETS}"
    broken = central_file(C).replace(f"({part})", f'({part}{{node!="n2"}})')
    assert broken != central_file(C)
    one = _layout(tmp_path, "one", {"recording.rules.yml": recording_file(C)})
    two = _layout(tmp_path, "two", {"node.rules.yml": node_file(C),
                                    "central.rules.yml": broken})
    quantile = {n.JOB_OP_QUANTILE: []}
    _, out = _promtool(_test_file(tmp_path, "oracle", one, quantile, []))
    rc, out = _promtool(_test_file(tmp_path, "two", two, _harvest(out), []))
    assert rc != 0 and n.JOB_OP_QUANTILE in out


def _raw(pattern: str) -> re.Pattern:
    """A raw series matching `pattern`, not a record named after one."""
    return re.compile(rf"(?<![:\w]){pattern}(?![:\w])")


@pytest.mark.parametrize("pattern", NOT_SENT)
def test_the_central_rules_and_alerts_never_read_what_the_node_does_not_send(pattern):
    assert not _raw(pattern).search(central_file(C))
    assert not _raw(pattern).search(alerts_file(C))


@pytest.mark.parametrize("family", PARTED)
def test_the_buckets_the_rules_read_are_read_at_the_node(family):
    assert any(re.fullmatch(p, family) for p in NOT_SENT)
    assert _raw(family).search(node_file(C)) and _raw(family).search(recording_file(C))


def test_per_process_records_are_evaluated_at_the_node_only():
    central = {r["record"] for g in yaml.safe_load(central_file(C))["groups"]
               for r in g["rules"]}
    node = {r["record"] for g in yaml.safe_load(node_file(C))["groups"] for r in g["rules"]}
    one = {r["record"] for g in yaml.safe_load(recording_file(C))["groups"] for r in g["rules"]}
    assert central | {r for r in node if not r.startswith("node_")} == one
    assert not central & node


DEPLOY = Path(__file__).resolve().parents[2] / "deploy/prometheus"


def _local(path: Path, tmp_path, rewrite: dict[str, Path]) -> Path:
    """The shipped config with its container paths pointed at the repository's files."""
    cfg = yaml.safe_load(path.read_text())
    cfg["rule_files"] = [str(rewrite[Path(f).name]) for f in cfg["rule_files"]]
    local = tmp_path / path.name
    local.write_text(yaml.safe_dump(cfg))
    return local


def test_the_two_tier_central_config_loads_the_central_rules_and_the_alerts(tmp_path):
    files = {"dpobs-central.rules.yml": DEPLOY / "node-tier/dpobs-central.rules.yml",
             "dpobs-alerts.rules.yml": DEPLOY / "rules/dpobs-alerts.rules.yml"}
    text = (DEPLOY / "central-node-tier.yml").read_text()
    assert "--web.enable-remote-write-receiver" in text
    assert sorted(Path(f).name for f in yaml.safe_load(text)["rule_files"]) == sorted(files)
    out = run(tool("promtool"), "check", "config",
              _local(DEPLOY / "central-node-tier.yml", tmp_path, files))
    assert all(str(p) in out for p in files.values())


def test_the_node_config_loads_the_node_rules_and_sends_no_bucket(tmp_path):
    rules = DEPLOY / "node-tier/dpobs-node.rules.yml"
    cfg = yaml.safe_load((DEPLOY / "node.yml").read_text())
    drops = [r["regex"] for r in cfg["remote_write"][0]["write_relabel_configs"]
             if r["action"] == "drop"]
    assert "|".join(NOT_SENT) in drops
    out = run(tool("promtool"), "check", "config",
              _local(DEPLOY / "node.yml", tmp_path, {rules.name: rules}))
    assert str(rules) in out


def test_the_default_config_reads_every_part():
    """A part no rule reads means rules.py changed under node_tier.py: its one-tier text
    no longer occurs, and the central rule would read raw series again."""
    assert [p.name for p in used_parts(C)] == [p.name for p in parts(C)]


def test_without_classic_quantiles_the_buckets_part_goes_too(tmp_path):
    c = Config(classic_quantiles=False, native_quantile_interval="1m")
    node, central = node_file(c), central_file(c)
    assert f"node_{n.JOB_OP_LE_BUCKETS}" not in node
    assert not _raw("dpobs_.+_bucket").search(central)
    for name, text in (("node", node), ("central", central)):
        (tmp_path / f"{name}.yml").write_text(text)
    run(tool("promtool"), "check", "rules", tmp_path / "node.yml", tmp_path / "central.yml")
