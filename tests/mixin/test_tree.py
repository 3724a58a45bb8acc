"""`dpobs mixin --out DIR`: the repository's deploy/ and dashboards/ are exactly its output,
and its one Config drives rules, alerts, routing and dashboards alike."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.promql import literal_comparisons, tokenize

from dpobs_otel import cli
from dpobs_otel.mixin import Config, build

ROOT = Path(__file__).resolve().parents[2]


def files_under(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_repository_is_exactly_the_mixin_output(tmp_path, capsys):
    assert cli.main(["mixin", "--out", str(tmp_path)]) == 0
    written = files_under(tmp_path)
    assert capsys.readouterr().out.split() == [str(tmp_path / n) for n in sorted(written)]
    repo = {f"dashboards/{n}": t for n, t in files_under(ROOT / "dashboards").items()}
    repo |= files_under(ROOT / "deploy")
    assert sorted(repo) == sorted(written), "run `dpobs mixin --out deploy --dashboards-out dashboards`"
    stale = [n for n in written if repo[n] != written[n]]
    assert not stale, f"{stale} differ from `dpobs mixin` output: run `dpobs mixin --out deploy --dashboards-out dashboards`"
    assert {p.split("/")[0] for p in written} == {
        "prometheus", "alertmanager", "grafana", "kubernetes", "agent", "dashboards"}
    assert {"prometheus/prometheus.yml", "prometheus/central.yml"} <= written.keys()
    assert any(p.startswith("prometheus/tests/") for p in written)


def test_dashboards_out_splits_the_tree_as_the_repository_does(tmp_path):
    deploy, boards = tmp_path / "deploy", tmp_path / "dashboards"
    assert cli.main(["mixin", "--out", str(deploy), "--dashboards-out", str(boards)]) == 0
    assert files_under(deploy) == files_under(ROOT / "deploy")
    assert files_under(boards) == files_under(ROOT / "dashboards")


def rules_of(files: dict[str, str], name: str) -> list[dict]:
    doc = yaml.safe_load(files[f"prometheus/rules/{name}"])
    return [r for g in doc["groups"] for r in g["rules"]]


ALERTS, RECORDING = "dpobs-alerts.rules.yml", "dpobs-recording.rules.yml"
KNOBS = Config(frac_of_step_warning=0.3, frac_of_step_critical=0.7, frac_of_step_for="7m",
               error_ratio_warning=0.02, error_ratio_critical=0.2, error_ratio_critical_for="2m",
               overhead_info=0.1, outstanding_bytes_floor=12345, target_down_for="9m",
               straggler_factor=3.5, straggler_for="20m", weights_stale_versions=3,
               weights_stale_for="12m", weight_sync_slow_frac=0.4, weight_sync_slow_for="25m",
               ray_hub_share=0.6, ray_hub_min_processes=5, ray_hub_min_bytes=2e7,
               ray_hub_for="11m", ray_transfer_slow_bandwidth=5e7,
               ray_transfer_slow_min_bytes=3e6, ray_transfer_slow_for="13m")
# (alert, severity) -> the knobs that must decide it: (comparison, threshold, for)
EXPECTED = {
    ("DpobsDataPlaneDominatesStep", "warning"): (">", 0.3, "7m"),
    ("DpobsDataPlaneDominatesStep", "critical"): (">", 0.7, "7m"),
    ("DpobsOperationErrors", "warning"): (">", 0.02, "15m"),
    ("DpobsOperationErrors", "critical"): (">", 0.2, "2m"),
    ("DpobsInstrumentationOverheadHigh", "info"): (">", 0.1, "30m"),
    ("DpobsOutstandingBytesGrowing", "warning"): (">", 12345, "1h"),
    ("DpobsTargetDown", "warning"): ("==", 0, "9m"),
    ("DpobsDataPlaneStraggler", "warning"): (">=", 3.5, "20m"),
    ("DpobsWeightsStale", "warning"): (">", 3, "12m"),
    ("DpobsWeightSyncSlow", "warning"): (">", 0.4, "25m"),
    ("DpobsRayHub", "info"): (">", 0.6, "11m"),
    ("DpobsRayTransferSlow", "warning"): ("<", 5e7, "13m"),
}
# Floors beside an alert's threshold: (alert, severity) -> the comparisons they add.
FLOORS = {
    ("DpobsRayHub", "info"): {(">=", 5.0), (">=", 2e7)},
    ("DpobsRayTransferSlow", "warning"): {(">=", 3e6)},
}


def test_alert_thresholds_and_durations_come_from_the_config():
    alerts = {(r["alert"], r["labels"]["severity"]): r for r in rules_of(build(KNOBS), ALERTS)}
    for key, (op, value, for_) in EXPECTED.items():
        assert (op, float(value)) in literal_comparisons(alerts[key]["expr"]), key
        assert alerts[key]["for"] == for_, key
    for key, floors in FLOORS.items():
        assert floors <= set(literal_comparisons(alerts[key]["expr"])), key


def test_dashboards_read_thresholds_from_the_config():
    dash = json.loads(build(KNOBS)["dashboards/dpobs-overview.json"])
    panels = [p for r in dash["panels"] for p in ([r] + r.get("panels", []))]
    (now,) = [p for p in panels if p["title"] == "Exposed fraction of step (now)"]
    steps = [s["value"] for s in now["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert steps == [None, 0.3, 0.7]
    assert "Yellow at 30%, red at 70%" in now["description"]
    (errors,) = [p for p in panels if p["title"] == "Error ratio by op"]
    assert "2% and 20%" in errors["description"]
    (weights,) = [p for p in panels if p["title"] == "Weight sync share of step (now)"]
    assert [s["value"] for s in weights["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [
        None, 0.4]
    assert "Yellow at 40%" in weights["description"]
    (bandwidth,) = [p for p in panels if p["title"] == "Ray fetch bandwidth per node"]
    assert "below 50 MB/s into a node that pulls at least 3 MB/s, for 13m" in bandwidth[
        "description"]
    (hub,) = [p for p in panels if p["title"] == "Ray hub share"]
    assert "above 60% in a job of 5+ processes moving at least 20 MB/s" in hub["description"]


def groupings(expr: str) -> list[list[str]]:
    """The label list of every by(...)/on(...)/without(...) in an expression."""
    tokens, out = [t for _, t in tokenize(expr)], []
    for i, t in enumerate(tokens):
        if t in ("by", "on", "without") and tokens[i + 1] == "(":
            end = tokens.index(")", i)
            out.append([x for x in tokens[i + 2:end] if x != ","])
    return out


def test_cluster_label_is_kept_by_every_aggregation_and_match():
    files = build(Config(cluster_label="cluster"))
    for r in rules_of(files, RECORDING) + rules_of(files, ALERTS):
        lists = groupings(r["expr"])
        assert all("cluster" in g for g in lists), (r.get("record") or r["alert"], lists)
        for _, agg in re.findall(r"\b(sum|max|min|count|avg)\b\s*(\(|by)", r["expr"]):
            assert agg == "by", f"{r.get('record') or r['alert']}: an aggregation without by()"
    am = yaml.safe_load(files["alertmanager/alertmanager.yml"])
    assert am["route"]["group_by"][0] == "cluster"
    assert am["inhibit_rules"][0]["equal"][0] == "cluster"
    names = [v["name"] for v in json.loads(files["dashboards/dpobs-overview.json"])["templating"]["list"]]
    assert "cluster" in names


def test_cluster_label_keeps_the_promtool_tests_passing(tmp_path):
    """Inputs without the label group exactly as before, so the shipped tests still hold."""
    promtool = shutil.which("promtool") or pytest.fail("promtool is not on PATH")
    for rel, text in build(Config(cluster_label="cluster")).items():
        if rel.startswith("prometheus/"):
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(text)
    tests = sorted(str(p) for p in (tmp_path / "prometheus/tests").glob("*.yml"))
    assert tests
    proc = subprocess.run([promtool, "test", "rules", *tests], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


GROUPINGS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def test_job_selector_reaches_every_raw_selector():
    sel = 'job=~"grpo-.*"'
    files = build(Config(job_selector=sel))
    seen = 0
    for r in rules_of(files, RECORDING) + rules_of(files, ALERTS):
        tokens = [t for _, t in tokenize(r["expr"])]
        depth = [0] * len(tokens)  # inside a selector's braces: label names, not series
        for i, t in enumerate(tokens[1:], 1):
            depth[i] = depth[i - 1] + (tokens[i - 1] == "{") - (t == "}")
        # a grouping's or a join's label list (`group_left (ray_node)`): label names too
        listed, inside = set(), False
        for i, t in enumerate(tokens):
            inside = (inside or (t == "(" and i and tokens[i - 1] in GROUPINGS)) and t != ")"
            if inside:
                listed.add(i)
        raw = [i for i, t in enumerate(tokens) if depth[i] == 0 and i not in listed
               and (t == "up" or t.startswith(("dpobs_", "ray_")))]
        for i in raw:  # raw series (recorded ones have a colon and are already selected)
            matchers = "".join(tokens[i + 1:tokens.index("}", i)]) if tokens[i + 1] == "{" else ""
            assert sel.replace(" ", "") in matchers, (r.get("record") or r["alert"], tokens[i])
            seen += 1
    assert seen > 20


def test_promtool_tests_are_left_out_when_thresholds_differ():
    assert not [p for p in build(KNOBS) if p.startswith("prometheus/tests/")]


def test_dashboards_without_the_extra_say_which_to_install(tmp_path):
    """grafana-foundation-sdk made unimportable: a one-line hint, no traceback."""
    code = ("import sys; sys.modules['grafana_foundation_sdk'] = None\n"
            "from dpobs_otel import cli\n"
            f"sys.exit(cli.main(sys.argv[1:]))")
    for command in ("dashboards", "mixin"):
        proc = subprocess.run([sys.executable, "-c", code, command, "--out", str(tmp_path)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert "pip install 'dpobs-otel[dashboards]'" in proc.stderr
        assert "Traceback" not in proc.stderr
