"""The committed dashboards are current, complete, name only real series, and parse in Prometheus."""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import yaml

from dpobs_otel import dashboards
from dpobs_otel.demo.stack import Stack

ROOT = Path(__file__).resolve().parents[1]
DASH_DIR = ROOT / "dashboards"
RULES_DIR = ROOT / "deploy" / "prometheus" / "rules"
UIDS = {"dpobs-overview", "dpobs-process"}

# The series DESIGN.md pins (OpenTelemetry instrument -> Prometheus series).
_HISTOGRAMS = ("dpobs_client_operation_duration_seconds", "dpobs_step_duration_seconds",
               "dpobs_codec_duration_seconds")
PINNED = {f"{h}_{s}" for h in _HISTOGRAMS for s in ("bucket", "sum", "count")} | {
    "dpobs_client_operation_errors_total", "dpobs_client_transferred_bytes_total",
    "dpobs_client_keys_total", "dpobs_client_rows_missing_total",
    "dpobs_client_outstanding_size_bytes", "dpobs_client_outstanding_keys",
    "dpobs_instrumentation_time_seconds_total", "dpobs_instrumentation_errors_total",
    "dpobs_guard_rows_recorded_total", "dpobs_guard_rows_checked_total",
    "dpobs_guard_rows_mismatched_total", "dpobs_guard_rows_unverified_total",
    "dpobs_guard_fields_skipped_total", "dpobs_guard_failures_total",
}


# --- a small PromQL tokenizer: enough to tell metric names from functions and labels ---

_TOKEN = re.compile(r"""
    (?P<str>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+)
  | (?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=(){},])
  | (?P<ws>\s+)""", re.X)
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset"} | _GROUPING


def tokenize(expr: str) -> list[tuple[str, str]]:
    tokens, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot tokenize {expr[pos:]!r} in {expr!r}")
        if m.lastgroup != "ws":
            tokens.append((m.lastgroup, m.group()))
        pos = m.end()
    return tokens


def metric_names(expr: str) -> set[str]:
    """Identifiers that name series: not functions or aggregations (followed by `(` or
    by/without), not keywords, not label names inside `{}` or in a by/on(...) list."""
    tokens, names, depth, i = tokenize(expr), set(), 0, 0
    while i < len(tokens):
        kind, text = tokens[i]
        nxt = tokens[i + 1][1] if i + 1 < len(tokens) else None
        if text == "{":
            depth += 1
        elif text == "}":
            depth -= 1
        elif kind == "ident" and depth == 0:
            if text in _GROUPING and nxt == "(":
                i = [t for _, t in tokens].index(")", i)  # skip the label list
            elif text not in _KEYWORDS and nxt not in ("(", "by", "without"):  # not sum by
                names.add(text)
        i += 1
    return names


def test_tokenizer_tells_metrics_from_functions_and_labels():
    expr = ('histogram_quantile(0.9, sum by (op, le) (rate(a_bucket{op="get", x=~"$v"}[1m])))'
            ' / on (op) group_left b:c:rate5m and ignoring(le) sum without (op) (d)'
            ' unless e offset 1m30s')
    assert metric_names(expr) == {"a_bucket", "b:c:rate5m", "d", "e"}


# --- what the dashboards contain ---

def load(uid: str) -> dict:
    return json.loads((DASH_DIR / f"{uid}.json").read_text())


def panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.extend(p.get("panels", []) if p["type"] == "row" else [p])
    return out


def all_targets():
    for uid in UIDS:
        for p in panels(load(uid)):
            for t in p["targets"]:
                yield uid, p["title"], t


def recording_rules() -> set[str]:
    files = sorted(RULES_DIR.glob("*.yml")) + sorted(RULES_DIR.glob("*.yaml"))
    assert files, f"no rule files in {RULES_DIR}"
    return {r["record"] for f in files for g in yaml.safe_load(f.read_text())["groups"]
            for r in g["rules"] if "record" in r}


def test_dashboards_are_current(tmp_path):
    dashboards.run(argparse.Namespace(out=tmp_path))
    fresh = {p.name: p.read_bytes() for p in tmp_path.glob("*.json")}
    committed = {p.name: p.read_bytes() for p in DASH_DIR.glob("*.json")}
    assert fresh.keys() == committed.keys()
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"{stale} are stale: run `make dashboards`"


def test_both_uids_and_a_prometheus_datasource_variable():
    for uid in UIDS:
        dash = load(uid)
        assert dash["uid"] == uid
        ds = [v for v in dash["templating"]["list"] if v["name"] == "datasource"]
        assert len(ds) == 1 and ds[0]["type"] == "datasource" and ds[0]["query"] == "prometheus"


def test_process_dashboard_has_job_role_instance_variables():
    names = {v["name"] for v in load("dpobs-process")["templating"]["list"]}
    assert {"job", "role", "instance"} <= names


@pytest.mark.parametrize("uid", sorted(UIDS))
def test_every_panel_is_complete(uid):
    for p in panels(load(uid)):
        where = f"{uid} / {p['title']}"
        assert p.get("description", "").strip(), f"{where}: no description"
        assert p["fieldConfig"]["defaults"].get("unit"), f"{where}: no unit"
        assert p["datasource"]["uid"] == "${datasource}", f"{where}: fixed datasource"
        assert p["targets"], f"{where}: no query"
        for t in p["targets"]:
            assert t["expr"].strip() and t["refId"], f"{where}: empty target"
            assert t.get("legendFormat"), f"{where}: no legend"
            assert t["datasource"]["uid"] == "${datasource}", f"{where}: fixed datasource"
        if p["type"] == "timeseries":
            assert p["options"]["legend"]["showLegend"], f"{where}: legend hidden"


def test_every_metric_is_pinned_or_recorded():
    known = PINNED | recording_rules()
    for uid, title, t in all_targets():
        unknown = metric_names(substitute(t["expr"], ".*")) - known
        assert not unknown, f"{uid} / {title}: {sorted(unknown)} neither pinned nor recorded"


def test_raw_series_use_rate_interval():
    # Recording rules carry the 5m window; raw series follow Grafana's resolution instead.
    for uid, title, t in all_targets():
        windows = set(re.findall(r"\[([^\]]*)\]|offset\s+([$\w]+)", t["expr"]))
        windows = {w for pair in windows for w in pair if w}
        assert windows <= {"$__rate_interval"}, f"{uid} / {title}: {windows}"


# --- every expression parses in a real Prometheus ---

def substitute(expr: str, value: str) -> str:
    """What Grafana would send: the rate interval as 1m, template variables as `value`."""
    expr = expr.replace("$__rate_interval", "1m")
    return re.sub(r"\$\{?(job|role|instance)\}?", value, expr)


@pytest.fixture(scope="module")
def prometheus():
    # The demo's private stack: the real deploy/ config and rule files, free loopback ports,
    # stopped and cleaned up afterwards; missing binaries fail the test (CI installs them).
    with Stack() as stack:
        yield stack


def api(stack: Stack, path: str, params: dict) -> dict:
    return stack.get(f"{stack.prometheus}{path}", params)


@pytest.mark.parametrize("value", [".*", "dpobs"])
def test_every_expression_runs_in_prometheus(prometheus, value):
    for uid, title, t in all_targets():
        expr = substitute(t["expr"], value)
        body = api(prometheus, "/api/v1/query", {"query": expr})
        assert body["status"] == "success", f"{uid} / {title}: {expr}: {body.get('error')}"


def test_every_variable_selector_runs_in_prometheus(prometheus):
    for uid in UIDS:
        for v in load(uid)["templating"]["list"]:
            if v["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.+), *(\w+)\)", v["definition"])
            assert m, f"{uid} / ${v['name']}: not label_values(selector, label)"
            match = substitute(m.group(1), ".*")
            body = api(prometheus, "/api/v1/series", {"match[]": match})
            assert body["status"] == "success", f"{uid} / ${v['name']}: {body.get('error')}"
