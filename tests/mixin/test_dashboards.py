"""The committed dashboards are current, complete, name only real series, and parse in Prometheus."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers.promql import metric_names

from dpobs_otel import cli, names
from dpobs_otel.adapters.transferqueue import exporter as tq
from dpobs_otel.testing.stack import Stack
from dpobs_otel.mixin import dashboards

ROOT = Path(__file__).resolve().parents[2]
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
    "dpobs_client_operation_duration_native_seconds",  # a native histogram: one series
    names.WEIGHTS_VERSION_SERIES, names.WEIGHTS_CHECKED_SERIES,
    names.WEIGHTS_MISMATCHED_SERIES, f"{names.RAY_SERIALIZATION_SERIES}_sum",
    names.RAY_OWNED_SERIES,
}
# TransferQueue's own series the overview reads raw (its exporter's spelling, exporter.py).
STORE_SERIES = {tq.STORAGE_ACTIVE_KEYS}


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


def test_dashboards_are_current():
    fresh = dashboards.build_dashboards()
    committed = {p.name: p.read_text() for p in DASH_DIR.glob("*.json")}
    assert fresh.keys() == committed.keys()
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"{stale} are stale: run `dpobs mixin --out deploy --dashboards-out dashboards`"


def test_dashboards_command_writes_the_committed_files(tmp_path, capsys):
    assert cli.main(["dashboards", "--out", str(tmp_path)]) == 0
    written = {p.name: p.read_text() for p in tmp_path.iterdir()}
    assert written == {p.name: p.read_text() for p in DASH_DIR.glob("*.json")}
    assert capsys.readouterr().out.split() == [str(tmp_path / n) for n in sorted(written)]


def test_both_uids_and_a_prometheus_datasource_variable():
    for uid in UIDS:
        dash = load(uid)
        assert dash["uid"] == uid
        ds = [v for v in dash["templating"]["list"] if v["name"] == "datasource"]
        assert len(ds) == 1 and ds[0]["type"] == "datasource" and ds[0]["query"] == "prometheus"


def test_overview_compares_jobs_side_by_side():
    """A multi-select job variable, and every series tells its job apart: by the legend,
    or (stacked panels, whose stacks would mix jobs) by one panel copy per job."""
    dash = load("dpobs-overview")
    (job,) = [v for v in dash["templating"]["list"] if v["name"] == "job"]
    assert job["multi"] and job["includeAll"]
    repeated = 0
    for p in panels(dash):
        if p.get("repeat") == "job":
            repeated += 1
            assert p["repeatDirection"] == "h" and "$job" in p["title"], p["title"]
            continue
        if p["type"] == "table":
            continue  # its job column names the job
        for t in p["targets"]:
            assert "{{job}}" in t["legendFormat"], (p["title"], t["legendFormat"])
    stacked = [p for p in panels(dash)
               if p.get("fieldConfig", {}).get("defaults", {}).get("custom", {})
               .get("stacking", {}).get("mode") == "normal"]
    assert stacked and all(p.get("repeat") == "job" for p in stacked)
    assert repeated >= len(stacked)


def test_overview_and_process_link_to_each_other():
    overview, process = load("dpobs-overview"), load("dpobs-process")
    (down,) = overview["links"]
    (up,) = process["links"]
    assert down["url"] == "/d/dpobs-process" and up["url"] == "/d/dpobs-overview"
    assert all(link["includeVars"] and link["keepTime"] for link in (down, up))
    assert "drill down" in (down["title"] + overview["description"]).lower()


def test_process_dashboard_has_job_node_role_instance_variables():
    names = {v["name"] for v in load("dpobs-process")["templating"]["list"]}
    assert {"job", "node", "role", "instance"} <= names


@pytest.mark.parametrize("uid", sorted(UIDS))
def test_node_variable_also_matches_series_without_node(uid):
    """On one machine series have no node label; All must be `.*` (which matches an empty
    label), not Grafana's default alternation of the values it found (none)."""
    (node,) = [v for v in load(uid)["templating"]["list"] if v["name"] == "node"]
    assert node["includeAll"] and node["allValue"] == ".*" and node["multi"]
    assert node["current"]["value"] == ["$__all"]


def test_per_process_panels_show_the_node():
    """Same instance on two nodes stays two processes: every per-process query keeps node
    and names it in its legend."""
    for uid, title, t in all_targets():
        if uid == "dpobs-process" or "instance" in t["legendFormat"]:
            assert "{{node}}" in t["legendFormat"], (uid, title)
            assert 'node=~"$node"' in t["expr"], (uid, title)
            for by in re.findall(r"by \(([^)]*)\)", t["expr"]):
                assert "node" in by, (uid, title, by)
    overview = [p for p in panels(load("dpobs-overview")) if p["type"] == "table"]
    assert overview and "node" in json.dumps(overview[0]["transformations"])


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
    known = PINNED | STORE_SERIES | recording_rules()
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
    return re.sub(r"\$\{?(cluster|job|node|role|instance)\}?", value, expr)


@pytest.fixture(scope="module")
def prometheus():
    # The demo's private stack: the real deploy/ config and rule files, free loopback ports,
    # stopped and cleaned up afterwards; missing binaries fail the test (CI installs them).
    with Stack() as stack:
        yield stack


def api(stack: Stack, path: str, params: dict) -> dict:
    return stack.prom.get(path, **params)


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


# --- the store's own account (issue 33) ---

STORE_ROW = "The store's own account"
RUNBOOK = ROOT / "docs" / "runbook.md"


def row_panels(dash: dict, title: str) -> list[dict]:
    """The panels under the row `title` (collapsed or not)."""
    out, inside = [], False
    for p in dash["panels"]:
        if p["type"] == "row":
            inside = p["title"] == title
            out.extend(p.get("panels", []) if inside else [])
        elif inside:
            out.append(p)
    return out


def test_store_row_has_the_panels_the_runbook_names():
    """DpobsUnmeasuredClients's runbook section sends the reader to this row and these
    panels: their titles must be the ones it prints."""
    got = {p["title"]: p for p in row_panels(load("dpobs-overview"), STORE_ROW)}
    split = got.pop("Client versus server time per op: $job")
    assert set(got) == {"Server share per op", "Coverage per op",
                        "Calls made and served per op",
                        "Keys: the store's active beside dpobs's outstanding"}
    section = RUNBOOK.read_text().split("## DpobsUnmeasuredClients", 1)[1].split("\n## ")[0]
    section = " ".join(section.split())  # a title may wrap across lines
    for title in (STORE_ROW, "Coverage per op", "Calls made and served per op"):
        assert f"*{title}*" in section, title
    custom = split["fieldConfig"]["defaults"]
    assert custom["custom"]["stacking"]["mode"] == "normal" and custom["max"] == 1
    assert split["repeat"] == "job"


def test_store_row_reads_only_the_stores_account():
    """Every query of the row needs the store's records or its own series, so the row stays
    empty for a job whose store has no exporter scraped; and the keys panel sets the store's
    keys beside dpobs's own."""
    store = {r for r in recording_rules() if ":dpobs_store_" in r} | STORE_SERIES
    panels_ = row_panels(load("dpobs-overview"), STORE_ROW)
    for p in panels_:
        for t in p["targets"]:
            assert metric_names(substitute(t["expr"], ".*")) & store, (p["title"], t["expr"])
    (keys,) = [p for p in panels_ if p["title"].startswith("Keys")]
    assert [metric_names(t["expr"]) for t in keys["targets"]] == [
        {tq.STORAGE_ACTIVE_KEYS}, {names.OUTSTANDING_KEYS_SERIES, tq.STORAGE_ACTIVE_KEYS}]


def _promtool_eval(tmp_path: Path, inputs: dict[str, str], exprs: dict[str, list]) -> str:
    """Run promtool's unit test: `inputs` (series -> values) at 1m, each expr of `exprs`
    evaluated at 1m against its expected samples; promtool's output on failure."""
    tests = [{"interval": "1m",
              "input_series": [{"series": k, "values": v} for k, v in inputs.items()],
              "promql_expr_test": [{"expr": e, "eval_time": "1m", "exp_samples": want}
                                   for e, want in exprs.items()]}]
    (tmp_path / "t.yml").write_text(yaml.safe_dump({"rule_files": [], "tests": tests}))
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not on PATH (CI installs it)")
    r = subprocess.run([promtool, "test", "rules", str(tmp_path / "t.yml")],
                       capture_output=True, text=True, timeout=60)
    return "" if r.returncode == 0 else r.stdout + r.stderr


def test_client_versus_server_split_keeps_each_op_in_its_band(tmp_path):
    """Job j: get takes half the data-plane time and its server share is 1.5 (parallel
    units: clamped to the whole band), put a quarter at server share 0.25, claim_meta a
    quarter with no server account. Job k has no store scraped: no series at all. Values are
    binary fractions, so promtool compares them exactly."""
    (split,) = [p for p in row_panels(load("dpobs-overview"), STORE_ROW) if p.get("repeat")]
    server, client, unbilled = (substitute(t["expr"], ".*") for t in split["targets"])
    share, ss = names.JOB_OP_SHARE, names.JOB_OP_STORE_SERVER_SHARE
    inputs = {f'{share}{{job="j",op="get"}}': "0.5x2", f'{share}{{job="j",op="put"}}': "0.25x2",
              f'{share}{{job="j",op="claim_meta"}}': "0.25x2",
              f'{share}{{job="k",op="get"}}': "1x2",
              f'{ss}{{job="j",op="get"}}': "1.5x2", f'{ss}{{job="j",op="put"}}': "0.25x2",
              f'{names.JOB_OP_STORE_SERVED}{{job="j",op="put"}}': "3x2"}

    def samples(**values):
        return [{"labels": f'{{job="j",op="{op}"}}', "value": v} for op, v in values.items()]
    assert _promtool_eval(tmp_path, inputs, {
        server: samples(get=0.5, put=0.0625), client: samples(get=0, put=0.1875),
        unbilled: [{"labels": f'{share}{{job="j",op="claim_meta"}}', "value": 0.25}]}) == ""
    # the check can fail: a wrong expectation is reported
    assert "claim_meta" in _promtool_eval(tmp_path, inputs, {unbilled: []})


def test_keys_sets_dpobs_beside_the_store_only_where_the_store_is_scraped(tmp_path):
    """Job j: two storage units hold 3 and 4 rows, two processes count 5 and 1 outstanding.
    Job k has no store scraped: its outstanding keys are the queue row's, not this panel's."""
    (keys,) = [p for p in row_panels(load("dpobs-overview"), STORE_ROW)
               if p["title"].startswith("Keys")]
    store, mine = (substitute(t["expr"], ".*") for t in keys["targets"])
    active, outstanding = tq.STORAGE_ACTIVE_KEYS, names.OUTSTANDING_KEYS_SERIES
    inputs = {f'{active}{{job="j",storage_unit_id="0"}}': "3x2",
              f'{active}{{job="j",storage_unit_id="1"}}': "4x2",
              f'{outstanding}{{job="j",instance="a"}}': "5x2",
              f'{outstanding}{{job="j",instance="b"}}': "1x2",
              f'{outstanding}{{job="k",instance="c"}}': "2x2"}
    assert _promtool_eval(tmp_path, inputs, {
        store: [{"labels": '{job="j"}', "value": 7}],
        mine: [{"labels": '{job="j"}', "value": 6}]}) == ""


# --- Ray's object store (issue 44) ---

RAY_ROW = "Ray object store"
RAY_ALERTS = (names.ALERT_RAY_STORE_SPILLING, names.ALERT_RAY_STORE_FULL)


def _runbook_titles(alert: str) -> set[str]:
    section = RUNBOOK.read_text().split(f"## {alert}", 1)[1].split("\n## ")[0]
    # *Title*, not **Bold.** (the section's lead words)
    return set(re.findall(r"(?<!\*)\*([^*]+)\*(?!\*)", " ".join(section.split())))


def test_ray_row_has_the_panels_the_runbook_names():
    """The two Ray alerts' runbook sections send the reader to the overview's row, the
    process dashboard's row and panels by title: each title they print exists there."""
    overview = {p["title"] for p in row_panels(load("dpobs-overview"), RAY_ROW)}
    process = {p["title"] for p in row_panels(load("dpobs-process"), "Ray ops by method")}
    rows = {r["title"] for uid in UIDS for r in load(uid)["panels"] if r["type"] == "row"}
    assert {"Ray op seconds per step by method", "Ray bytes per step by method",
            "Object store memory by location", "Object store used per node",
            "Spilled per node", "Object-store bytes owned per process"} <= overview
    for alert in RAY_ALERTS:
        named = {t for t in _runbook_titles(alert) if t[0].isupper() and not t.endswith(".")}
        panels_named = named & (overview | process | rows)
        assert RAY_ROW in panels_named and len(panels_named) >= 4, (alert, named)
        strays = {t for t in named - panels_named if t.startswith(("Ray ", "Object"))}
        assert not strays, (alert, strays)  # a title the dashboards do not have


def test_ray_row_reads_only_rays_records():
    """Every query of the row reads the Ray records (ray_rules.py), none the data plane's,
    so the row stays empty for a job without Ray and never mixes Ray's ops into it."""
    ray = {r for r in recording_rules() if ":dpobs_ray_" in r or r.startswith((
        "job_op_method", "job_node"))}
    for p in row_panels(load("dpobs-overview"), RAY_ROW):
        for t in p["targets"]:
            read = metric_names(substitute(t["expr"], ".*"))
            assert read and read <= ray, (p["title"], t["expr"])
    for p in row_panels(load("dpobs-process"), "Ray ops by method"):
        for t in p["targets"]:
            assert 'op=~"ray_.*"' in t["expr"] or names.RAY_OWNED_SERIES in t["expr"], p["title"]


# --- Where Ray's bytes travel (issue 54) ---

TRANSFER_ROW = "Ray: where the bytes travel"
TRANSFER_RECORDS = {names.JOB_FROM_NODE_NODE_RAY_REMOTE, names.JOB_OP_METHOD_LOCALITY_RAY_MOVED,
                    names.JOB_NODE_RAY_FETCH_BANDWIDTH, names.JOB_RAY_HUB_SHARE,
                    names.JOB_OP_METHOD_RAY_DATA}


def test_transfer_row_reads_the_transfer_records_and_each_is_shown():
    """The row reads the records of where Ray's bytes travel and nothing else, and each of
    them (but the per-process input of the hub share) has a panel."""
    panels = row_panels(load("dpobs-overview"), TRANSFER_ROW)
    read = set()
    for p in panels:
        for t in p["targets"]:
            got = metric_names(substitute(t["expr"], ".*"))
            assert got and got <= TRANSFER_RECORDS, (p["title"], t["expr"])
            read |= got
    assert read == TRANSFER_RECORDS


def test_the_node_matrix_has_a_row_per_source_and_a_column_per_destination():
    (matrix,) = [p for p in row_panels(load("dpobs-overview"), TRANSFER_ROW)
                 if p["title"] == "Ray node-to-node bytes"]
    (target,) = matrix["targets"]
    assert target["instant"] is True and target["format"] == "table"
    (grouping,) = [t for t in matrix["transformations"] if t["id"] == "groupingToMatrix"]
    assert grouping["options"]["rowField"] == names.RAY_FROM_NODE
    assert grouping["options"]["columnField"] == "node"
    assert f"by ({names.RAY_FROM_NODE}, node)" in target["expr"]


def test_ray_transfer_runbook_sections_name_the_rows_panels():
    """DpobsRayHub and DpobsRayTransferSlow send the reader to panels that exist."""
    overview = load("dpobs-overview")
    titles = {p["title"] for p in row_panels(overview, TRANSFER_ROW)}
    titles |= {p["title"] for p in row_panels(overview, RAY_ROW)}
    titles |= {r["title"] for uid in UIDS for r in load(uid)["panels"] if r["type"] == "row"}
    for alert in (names.ALERT_RAY_HUB, names.ALERT_RAY_TRANSFER_SLOW):
        named = {t for t in _runbook_titles(alert) if t.startswith(("Ray ", "Ray:"))}
        assert TRANSFER_ROW in named, alert
        assert named - {TRANSFER_ROW, RAY_ROW} <= titles, (alert, named - titles)
        assert len(named & titles) >= 3, (alert, named)
