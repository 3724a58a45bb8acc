"""DpobsDataPlaneStraggler's knobs (factor, minimum processes) decide what fires, checked with
the real promtool on rules generated from a non-default Config. The shipped promtool test
(critical_path.test.yml) pins the defaults, where two processes can never reach 2x their
median anyway (the median of two is their mean); a lower factor makes the minimum-processes
clause the only thing keeping a pair silent, so a rule without it fails here."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from dpobs_otel import names as n
from dpobs_otel.mixin import Config
from dpobs_otel.mixin.alerts import alerts_file
from dpobs_otel.mixin.dashboards import overview, render
from dpobs_otel.mixin.rules import recording_file

OP = n.OP_DURATION_SERIES


def _process_series(role: str, rank: int, mean_s: float) -> list[dict]:
    """One process making 60 gets a minute at mean_s each."""
    labels = f'job="j",instance="h{role}{rank}:9000",role="{role}",rank="{rank}",op="get"'
    return [{"series": f"{OP}_sum{{{labels}}}", "values": f"0+{60 * mean_s:g}x40"},
            {"series": f"{OP}_count{{{labels}}}", "values": "0+60x40"}]


def _fires(tmp_path, config: Config, means: dict[str, list[float]]) -> set[tuple[str, str]]:
    """(role, rank) of every straggler firing at 30m, read from promtool's verdict: the test
    file expects nothing, and promtool's failure lists what fired instead."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not on PATH (CI installs it)")
    (tmp_path / "rec.yml").write_text(recording_file(config))
    (tmp_path / "alerts.yml").write_text(alerts_file(config))
    series = [s for role, ms in means.items() for rank, m in enumerate(ms)
              for s in _process_series(role, rank, m)]
    test = {"rule_files": ["rec.yml", "alerts.yml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [
                {"eval_time": "30m", "alertname": n.ALERT_STRAGGLER, "exp_alerts": []}]}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test))
    r = subprocess.run([promtool, "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    out = r.stdout + r.stderr
    if r.returncode == 0:
        return set()
    assert "got:" in out, out  # a failure other than unexpected alerts
    got = out.split("got:", 1)[1]
    return {(role, str(rank)) for role, ms in means.items() for rank in range(len(ms))
            if f'instance="h{role}{rank}:9000"' in got}


def test_a_lower_factor_fires_in_a_role_of_three(tmp_path):
    # 0.1, 0.1, 0.16: the median is 0.1, so 1.6x: silent at 2, firing at 1.5.
    means = {"trainer": [0.1, 0.1, 0.16]}
    assert _fires(tmp_path, Config(), means) == set()
    assert _fires(tmp_path, Config(straggler_factor=1.5), means) == {("trainer", "2")}


def test_two_processes_do_not_make_a_role_even_at_a_lower_factor(tmp_path):
    # 0.1 and 0.5: 0.5 / median 0.3 = 1.67 >= 1.5, but a pair has no odd one out.
    means = {"rollout": [0.1, 0.5], "trainer": [0.1, 0.1, 0.5]}
    assert _fires(tmp_path, Config(straggler_factor=1.5), means) == {("trainer", "2")}


def test_the_minimum_number_of_processes_is_a_knob(tmp_path):
    means = {"trainer": [0.1, 0.1, 0.5]}
    assert _fires(tmp_path, Config(), means) == {("trainer", "2")}
    assert _fires(tmp_path, Config(straggler_min_processes=4), means) == set()


def test_the_dashboard_ratio_panel_is_the_alert_ratio(tmp_path):
    """The overview's straggler table, evaluated by promtool on per-process means: each
    process over its role's median, the node filter narrowing the rows, not the median."""

    dash = json.loads(render(overview))
    panels = [p for r in dash["panels"] for p in [r, *r.get("panels", [])]]
    (panel,) = [p for p in panels if p["title"].startswith("Processes by mean latency")]
    (target,) = panel["targets"]
    expr = re.sub(r"\$\{?job\}?", "j", target["expr"])
    expr = re.sub(r"\$\{?node\}?", "n1|n2", expr)  # n3, the slowest, is filtered out
    mean = n.INSTANCE_OP_MEAN
    series = [{"series": f'{mean}{{job="j",node="n{i}",instance="h{i}:9",role="trainer",'
                         f'rank="{i}",op="get"}}', "values": f"{m}x5"}
              for i, m in ((1, 0.25), (2, 0.5), (3, 1.5))]
    # The role's median (0.25, 0.5, 1.5) is 0.5, n3 included though it is not shown.
    want = [{"labels": f'{{job="j",node="n{i}",instance="h{i}:9",role="trainer",rank="{i}",'
                       f'op="get"}}', "value": v} for i, v in ((1, 0.5), (2, 1.0))]
    test = {"rule_files": [], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [{"expr": expr, "eval_time": "2m", "exp_samples": want}]}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test))
    promtool = shutil.which("promtool") or pytest.fail("promtool is not on PATH")
    r = subprocess.run([promtool, "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
