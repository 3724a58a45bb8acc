"""Prometheus rules, Alertmanager routing and the runbook, checked with the real promtool and
amtool. Missing tools fail these tests rather than skip them: CI installs both."""
from __future__ import annotations

import importlib.util
import inspect
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers.binaries import run, tool
from helpers.promql import literal_comparisons

from dpobs_otel import names
from dpobs_otel.mixin import Config
from dpobs_otel.mixin.rules import NATIVE_RULES

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/rules"
RECORDING = RULES / "dpobs-recording.rules.yml"
ALERTS = RULES / "dpobs-alerts.rules.yml"
PROM_TESTS = sorted((ROOT / "deploy/prometheus/tests").glob("*.yml"))
PROMETHEUS_YML = ROOT / "deploy/prometheus/prometheus.yml"
CENTRAL_YML = ROOT / "deploy/prometheus/central.yml"
ALERTMANAGER_YML = ROOT / "deploy/alertmanager/alertmanager.yml"
RUNBOOK = ROOT / "docs/runbook.md"
LIVE_TEST = ROOT / "tests/exporters/test_native_live.py"
SEVERITIES = {"critical", "warning", "info"}


def rules(path: Path) -> list[dict]:
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def test_promtool_check_rules():
    run(tool("promtool"), "check", "rules", RECORDING, ALERTS)


def test_promtool_unit_tests():
    assert PROM_TESTS, "no promtool tests under deploy/prometheus/tests"
    out = run(tool("promtool"), "test", "rules", *PROM_TESTS)
    assert "FAILED" not in out


def test_unit_tests_cover_every_rule_and_alert():
    """Every recording rule is asserted, every alert is shown firing and silent."""
    asserted, firing, silent = set(), set(), set()
    for f in PROM_TESTS:
        for case in yaml.safe_load(f.read_text())["tests"]:
            for t in case.get("promql_expr_test", []):
                if t.get("exp_samples"):  # the rule's series, a label selector allowed
                    asserted.add(t["expr"].strip().split("{", 1)[0])
            for t in case.get("alert_rule_test", []):
                (firing if t.get("exp_alerts") else silent).add(t["alertname"])
    records = {r["record"] for r in rules(RECORDING)}
    alerts = {r["alert"] for r in rules(ALERTS)}
    # promtool 2.42 cannot feed native histograms: those rules are tested live instead.
    assert records - asserted == set(NATIVE_RULES)
    assert alerts - firing == set()
    assert alerts - silent == set()


def test_rules_tested_live_are_the_native_ones_and_the_live_test_checks_each():
    """NATIVE_RULES excuses a rule from promtool only when it reads the native histogram,
    and only when the live test against a real Prometheus names a test that checks it."""
    reads_native = {r["record"] for r in rules(RECORDING)
                    if names.OP_DURATION_NATIVE_SERIES in r["expr"]}
    assert set(NATIVE_RULES) == reads_native
    spec = importlib.util.spec_from_file_location("native_live", LIVE_TEST)
    live = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(live)
    assert set(live.LIVE_CHECKS) == set(NATIVE_RULES)
    for record, test in live.LIVE_CHECKS.items():
        # the named test exists and queries the rule (through the module it calls into)
        const = next(k for k, v in vars(names).items() if v == record)
        assert test.startswith("test_") and callable(getattr(live, test, None)), test
        assert f"n.{const}" in inspect.getsource(live), (record, test)


def test_the_coarser_time_sums_read_the_finer_record_of_the_same_evaluation():
    """A scrape can commit between two rules of one evaluation, so two rate()s of the same
    counters may differ; summing the finer record instead makes the ops' shares add up to 1
    whatever lands in between (compare saw 1.0105 when each sum took its own rate)."""
    order = [r.get("record") for r in rules(RECORDING)]
    chain = [names.JOB_ROLE_OP_SECONDS, names.JOB_OP_SECONDS, names.JOB_SECONDS]
    exprs = {r["record"]: r["expr"] for r in rules(RECORDING) if r.get("record") in chain}
    for finer, coarser in zip(chain, chain[1:]):
        assert order.index(finer) < order.index(coarser), coarser  # this cycle's value
        assert finer in exprs[coarser] and "rate(" not in exprs[coarser], exprs[coarser]


def test_classic_quantiles_knob():
    from dpobs_otel.mixin.rules import recording_groups
    def records(c):
        return {r.body["record"] for g in recording_groups(c) for r in g.rules
                if "record" in r.body}
    on, off = records(Config()), records(Config(classic_quantiles=False))
    assert on - off == {names.JOB_OP_QUANTILE, names.JOB_OP_LE_BUCKETS}
    assert names.JOB_OP_NATIVE_QUANTILE in off


def test_native_quantile_interval_knob(tmp_path):
    from dpobs_otel.mixin.rules import recording_file, recording_groups
    def layout(c):
        return [(g.name, g.interval, [r.body.get("labels", {}).get("quantile")
                                      for r in g.rules if r.body.get("record") == names.JOB_OP_NATIVE_QUANTILE])
                for g in recording_groups(c)]
    assert layout(Config()) == [("dpobs-recording", None, list(names.QUANTILES))]
    c = Config(classic_quantiles=False, native_quantile_interval="1m")
    assert layout(c) == [("dpobs-recording", None, []),
                         ("dpobs-native-quantiles", "1m", list(names.QUANTILES))]
    # the same rules otherwise, and a file Prometheus loads
    flat = [r.body for g in recording_groups(c) for r in g.rules]
    assert sorted(map(str, flat)) == sorted(
        str(r.body) for g in recording_groups(Config(classic_quantiles=False)) for r in g.rules)
    path = tmp_path / "r.yml"
    path.write_text(recording_file(c))
    run(tool("promtool"), "check", "rules", path)


def test_prometheus_config_as_shipped():
    run(tool("promtool"), "check", "config", PROMETHEUS_YML)


def test_prometheus_config_loads_both_rule_files(tmp_path):
    # The shipped paths are the container's; point them at the repository to load the rules.
    cfg = yaml.safe_load(PROMETHEUS_YML.read_text())
    assert cfg["rule_files"] == ["/etc/prometheus/rules/*.rules.yml"]
    assert cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    job, itself = cfg["scrape_configs"]
    assert job["job_name"] == "dpobs"
    # itself: the rule groups' own series that DpobsRuleEvaluationSlow reads
    assert itself == {"job_name": "dpobs-prometheus",
                      "static_configs": [{"targets": ["localhost:9090"]}]}
    assert job["file_sd_configs"][0]["files"] == ["/etc/prometheus/file_sd/*.json"]
    assert {"scrape_interval", "evaluation_interval"} <= cfg["global"].keys()
    cfg["rule_files"] = [str(RULES / "*.rules.yml")]
    local = tmp_path / "prometheus.yml"
    local.write_text(yaml.safe_dump(cfg))
    out = run(tool("promtool"), "check", "config", local)
    assert str(RECORDING) in out and str(ALERTS) in out


def test_central_config_loads_both_rule_files_and_alerts(tmp_path):
    """What agents remote-write into: the same rules and Alertmanager, no dpobs scrape job of
    its own (the agents scrape), and it says how to turn the receiver on."""
    text = CENTRAL_YML.read_text()
    assert "--web.enable-remote-write-receiver" in text
    cfg = yaml.safe_load(text)
    assert cfg["rule_files"] == ["/etc/prometheus/rules/*.rules.yml"]
    assert cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    assert [j["job_name"] for j in cfg["scrape_configs"]] == ["dpobs-central"]
    cfg["rule_files"] = [str(RULES / "*.rules.yml")]
    local = tmp_path / "central.yml"
    local.write_text(yaml.safe_dump(cfg))
    out = run(tool("promtool"), "check", "config", local)
    assert str(RECORDING) in out and str(ALERTS) in out


def test_alertmanager_config():
    run(tool("amtool"), "check-config", ALERTMANAGER_YML)


@pytest.mark.parametrize("severity, receiver", [
    ("critical", "page"), ("warning", "ticket"), ("info", "none"), ("", "ticket")])
def test_alertmanager_routes_by_severity(severity, receiver):
    run(tool("amtool"), "config", "routes", "test", f"--config.file={ALERTMANAGER_YML}",
        f"--verify.receivers={receiver}", "alertname=DpobsOperationErrors", "job=dpobs",
        f"severity={severity}")


def test_alertmanager_grouping_and_inhibition():
    cfg = yaml.safe_load(ALERTMANAGER_YML.read_text())
    assert cfg["route"]["group_by"] == ["alertname", "job"]
    receivers = {r["name"]: r for r in cfg["receivers"]}
    assert receivers["page"]["webhook_configs"][0]["url"]
    assert receivers["ticket"]["webhook_configs"][0]["url"]
    assert set(receivers["none"]) == {"name"}  # info goes nowhere
    assert cfg["inhibit_rules"] == [{
        "source_matchers": ['severity="critical"'],
        "target_matchers": ['severity="warning"'],
        "equal": ["alertname", "job", "op"],
    }]


def test_alerts_are_well_formed():
    for r in rules(ALERTS):
        name, ann = r["alert"], r["annotations"]
        assert re.fullmatch(r"Dpobs[A-Z][A-Za-z]+", name), name
        assert r["labels"]["severity"] in SEVERITIES, name
        assert set(ann) == {"summary", "description", "runbook_url"}, name
        assert "{{" not in ann["summary"], f"{name}: summary must be static"
        assert "{{ $labels." in ann["description"], f"{name}: description must be templated"


def github_anchor(heading: str) -> str:
    """GitHub's heading id: lowercase, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_runbook_urls_are_the_docs_section_or_the_operators_url():
    """No placeholder site: by default runbook_url is the relative docs link
    docs/runbook.md#<lowercased name>, a heading that exists; with the operator's URL, that
    section there."""
    anchors = {github_anchor(m) for m in re.findall(r"^#+\s+(.+)$", RUNBOOK.read_text(), re.M)}
    for r in rules(ALERTS):
        url, name = r["annotations"]["runbook_url"], r["alert"]
        assert url == f"docs/runbook.md#{name.lower()}", name
        assert url.split("#", 1)[1] in anchors, f"{name}: no section in docs/runbook.md"
    custom = Config(runbook_base_url="https://wiki.example/ops/")
    assert custom.runbook_url("DpobsAgentDown") == "https://wiki.example/ops/docs/runbook.md#dpobsagentdown"


def test_no_placeholder_url_or_image_is_written(tmp_path):
    """`dpobs mixin --out DIR` with no argument writes no example.com-style link and no
    ghcr.io/example image: what it names is real or the operator's."""
    from dpobs_otel import cli
    assert cli.main(["mixin", "--out", str(tmp_path)]) == 0
    for f in tmp_path.rglob("*"):
        if f.is_file():
            text = f.read_text()
            assert "github.com/example" not in text and "ghcr.io/example/dpobs-otel" not in text, f


THRESHOLD_ROW = re.compile(r"^#\s+(Dpobs\w+)\s+(critical|warning|info)\s+([=<>!]=?)([\d.]+)\s+(\S+)", re.M)


def test_threshold_table_matches_rules():
    """The table at the top of the alerts file is the one place to read thresholds; keep it
    true. The threshold must be the whole right operand of a comparison in the expr (read
    with a PromQL tokenizer), not merely text somewhere in it."""
    table = {(n, s): (op, float(v), f) for n, s, op, v, f in THRESHOLD_ROW.findall(ALERTS.read_text())}
    alerts = rules(ALERTS)
    assert len(table) == len(alerts)
    for r in alerts:
        op, threshold, for_ = table[(r["alert"], r["labels"]["severity"])]
        assert (op, threshold) in literal_comparisons(r["expr"]), (r["alert"], op, threshold)
        assert r.get("for", "-") == for_, r["alert"]


@pytest.mark.parametrize("expr, found", [
    ("x > 0.25", [(">", 0.25)]),
    ("x > 0.25 * 2", []),                   # the operand is 0.5
    ("x > bool 0.05 and y", [(">", 0.05)]),
    ("histogram_quantile(0.25, x) > 1", [(">", 1.0)]),
    ('up{role!="0.25"} == 0', [("==", 0.0)]),
    ("x >= 0.25", [(">=", 0.25)]),
])
def test_threshold_reader_reads_the_operand(expr, found):
    assert literal_comparisons(expr) == found


def _asserted(path: Path):
    """(record name, exp_samples) of every promql_expr_test in a promtool file."""
    for case in yaml.safe_load(path.read_text())["tests"]:
        for t in case.get("promql_expr_test", []):
            yield t["expr"].strip().split("{")[0], t.get("exp_samples") or []


def test_zero_and_absent_are_told_apart():
    """Rules that filter a denominator with `> 0` must yield no sample (not 0) when nothing
    happened, and rules that pad with `or ... * 0` must yield 0 (not no sample) when the
    numerator's counter was never born. promtool compares exactly (an empty exp_samples
    fails on a 0 sample and the other way round), so each kind needs a case of its own."""
    zero = {n for f in PROM_TESTS for n, s in _asserted(f) if any(x["value"] == 0 for x in s)}
    absent = {n for f in PROM_TESTS for n, s in _asserted(f) if not s}
    for r in rules(RECORDING):
        expr = re.sub(r"\s+", " ", r["expr"])
        if r["record"] in NATIVE_RULES:  # absent-when-idle is asserted live, with the values
            continue
        if re.search(r"> 0\)", expr):
            assert r["record"] in absent, f"{r['record']}: no case asserting it is absent"
        if re.search(r"\* 0\b", expr):
            assert r["record"] in zero, f"{r['record']}: no case asserting it is 0"


def test_promtool_tells_absent_from_zero(tmp_path):
    """The premise of the test above, on the real promtool: a rule that yields 0 fails a
    case expecting no sample, and one that yields nothing fails a case expecting 0."""
    (tmp_path / "r.yml").write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "zero", "expr": "sum(a) * 0"}, {"record": "none", "expr": "sum(a) > 1"}]}]}))

    def case(expr: str, samples: list) -> subprocess.CompletedProcess:
        (tmp_path / "t.yml").write_text(yaml.safe_dump({
            "rule_files": ["r.yml"], "evaluation_interval": "1m", "tests": [{
                "interval": "1m", "input_series": [{"series": "a", "values": "1x3"}],
                "promql_expr_test": [{"expr": expr, "eval_time": "1m",
                                      "exp_samples": samples}]}]}))
        return subprocess.run([tool("promtool"), "test", "rules", str(tmp_path / "t.yml")],
                              capture_output=True, text=True, timeout=60)

    assert case("zero", [{"labels": "zero", "value": 0}]).returncode == 0
    assert case("zero", []).returncode != 0
    assert case("none", []).returncode == 0
    assert case("none", [{"labels": "none", "value": 0}]).returncode != 0
