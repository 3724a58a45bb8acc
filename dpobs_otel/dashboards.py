"""`dpobs dashboards --out DIR`: the Grafana dashboards, generated so they cannot drift.

dpobs-overview answers cluster questions from the recording rules (5m windows, the same
numbers the alerts use); dpobs-process drills into one process from the raw series with
`$__rate_interval`, since the per-process rules stop at frac_of_step.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync

from dpobs_otel.panels import (SECONDS_PER_SECOND, Query, datasource_variable, heatmap_panel,
                               label_variable, row, stat_panel, thresholds, timeseries_panel)

JOB = '{job=~"$job"}'
PROC = '{job=~"$job", role=~"$role", instance=~"$instance"}'
RI = "[$__rate_interval]"
OP_SERIES = "dpobs_client_operation_duration_seconds"

# Shared reading notes, said once and reused wherever they apply.
OVERLAP = ("Data-plane time is measured around client calls; it can overlap compute when "
           "calls run on other threads, so it bounds the cost, it does not prove a stall.")
VOLUME = ("A byte put by one process and got by another is counted on both sides (write "
          "and read); do not add the directions up as network traffic.")
FRAC_STEPS = thresholds((None, "green"), (0.25, "yellow"), (0.5, "red"))  # = the alert


FRAC_QUERIES = (  # cluster mean and the slowest process, on both frac_of_step panels
    Query(f"job:dpobs_frac_of_step:ratio_rate5m{JOB}", "{{job}} mean"),
    Query(f"job:dpobs_frac_of_step:max_ratio_rate5m{JOB}", "{{job}} slowest process"),
)


def _frac_panels() -> list:
    now = stat_panel(
        "Data-plane fraction of step (now)",
        "Data-plane time / step time over the last 5m: cluster mean and the slowest process. "
        "Yellow at 25%, red at 50%, as DpobsDataPlaneDominatesStep. " + OVERLAP,
        "percentunit",
        *FRAC_QUERIES, steps=FRAC_STEPS, width=8, height=8)
    over_time = timeseries_panel(
        "Data-plane fraction of step",
        "The same ratio over time. A slowest process far above the mean points at one "
        "straggler (drill down in dpobs-process), not at the store. " + OVERLAP,
        "percentunit",
        *FRAC_QUERIES, width=16)
    return [now, over_time]


def _time_panels() -> list:
    by_op = timeseries_panel(
        "Data-plane time by op",
        "Seconds spent inside client calls per second of wall clock, summed over all "
        "processes and stacked by op (2 s/s = two processes busy all the time). "
        "Failed calls are included. " + OVERLAP,
        SECONDS_PER_SECOND,
        Query(f"job_op:{OP_SERIES}:rate5m{JOB}", "{{op}}"), stacked=True)
    share = timeseries_panel(
        "Share of data-plane time by op",
        "Each op's fraction of all data-plane time; the stack always reaches 100%, so a "
        "growing share can mean the other ops got faster. Read it with the panel on the left.",
        "percentunit",
        Query(f"job_op:dpobs_operation_share:ratio_rate5m{JOB}", "{{op}}"),
        stacked=True, max_value=1)
    ops = timeseries_panel(
        "Operations per second",
        "Completed client calls per second by op, failed ones included. One call may move "
        "many keys, so compare with bytes per second before calling an op chatty.",
        "ops", Query(f"job_op:dpobs_client_operations:rate5m{JOB}", "{{op}}"))
    return [by_op, share, ops]


def _latency_panels() -> list:
    quantiles = timeseries_panel(
        "Latency by op: p50, p90, p99 and mean",
        "Quantiles are interpolated inside fixed buckets (0.1 ms to 30 s), so they are only "
        "as precise as the bucket they fall in; beyond 30 s they read as 30 s. The mean "
        "hides tails: trust p99 for stalls.",
        "s",
        Query(f"job_op:{OP_SERIES}:quantile_rate5m{JOB}", "{{op}} p{{quantile}}"),
        Query(f"job_op:{OP_SERIES}:mean_rate5m{JOB}", "{{op}} mean"), log_scale=True)
    heat = heatmap_panel(
        "Latency distribution (all ops)",
        "Calls per bucket per interval, all ops and processes together; the y axis shows "
        "bucket upper bounds. Two bands usually mean two ops or a cache hit/miss split: "
        "filter by op in Explore to tell.",
        "s",
        Query(f"sum by (le) (increase({OP_SERIES}_bucket{JOB}{RI}))", "{{le}}"))
    return [quantiles, heat]


def _volume_panels() -> list:
    volume = timeseries_panel(
        "Bytes per second by op and direction",
        "Tensor payload (exact nbytes) plus msgpack size of other fields. " + VOLUME,
        "Bps",
        Query(f"job_op_direction:dpobs_client_transferred_bytes:rate5m{JOB}",
              "{{op}} {{direction}}"))
    outstanding = timeseries_panel(
        "Outstanding bytes",
        "Bytes written and not yet cleared, as the clients count them. A line that only "
        "rises is a leak (DpobsOutstandingBytesGrowing); clears made outside the "
        "instrumented client are invisible here and look like one.",
        "bytes", Query(f"job:dpobs_client_outstanding_size_bytes:sum{JOB}", "{{job}}"))
    errors = timeseries_panel(
        "Error ratio by op",
        "Failed calls / all calls over 5m: 0 when every call succeeded, no data when the "
        "op made no calls. "
        "Alerts fire at 1% and 5% (DpobsOperationErrors).",
        "percentunit",
        Query(f"job_op:dpobs_client_operation_errors_per_operations:ratio_rate5m{JOB}",
              "{{op}}"))
    return [volume, outstanding, errors]


def _cost_panels() -> list:
    codec = timeseries_panel(
        "Codec time: pack and unpack",
        "Seconds per second spent serializing outside the client (tel.codec blocks). It is "
        "not part of data-plane time, so a fast store can still stall on a slow codec.",
        SECONDS_PER_SECOND,
        Query(f"job_stage:dpobs_codec_duration_seconds:rate5m{JOB}", "{{stage}}"),
        stacked=True)
    overhead = timeseries_panel(
        "Instrumentation overhead",
        "Time dpobs itself spends (measuring, hashing for the guard) as a fraction of "
        "data-plane time. Above 5% raises DpobsInstrumentationOverheadHigh; the wire guard "
        "is usually most of it.",
        "percentunit",
        Query(f"job:dpobs_instrumentation_time_per_operation_time:ratio_rate5m{JOB}",
              "{{job}}"))
    return [codec, overhead]


def _guard_stat(title: str, description: str, query: Query, **kw):
    # No data means nobody checked, which must not read as a clean zero.
    return stat_panel(title, description + " Empty means not checked, not clean.", "short",
                      query, no_value="not checked", **kw)


def _counted(series: str) -> str:
    """Increase over the interval, counting a series born inside it in full: OpenTelemetry
    creates a counter series at its first increment, which increase() alone never sees
    (the guard recording rules do the same over 5m)."""
    s = f"{series}{JOB}"
    return f"sum by (job) (({s} unless {s} offset $__rate_interval) or increase({s}{RI}))"


def _guard_panels() -> list:
    return [
        _guard_stat("Guard: rows checked (5m)",
                    "Rows whose hash was verified on read.",
                    Query(f"job:dpobs_guard_rows_checked:increase5m{JOB}", "{{job}}")),
        _guard_stat("Guard: rows unverified",
                    "Rows read with the guard on but no recorded hash to compare "
                    "(written before the guard, or by an unguarded process).",
                    Query(_counted("dpobs_guard_rows_unverified_total"), "{{job}}")),
        _guard_stat("Guard: fields skipped",
                    "Fields (not rows) the guard could not hash, by count over the "
                    "interval; see the reason label in Explore.",
                    Query(_counted("dpobs_guard_fields_skipped_total"), "{{job}}")),
        _guard_stat("Guard: rows mismatched (5m)",
                    "Rows whose bytes differ from what was written: corruption or "
                    "mis-sharding (DpobsWireHashMismatch). Zero only means clean if rows "
                    "checked is non-zero.",
                    Query(f"job:dpobs_guard_rows_mismatched:increase5m{JOB}", "{{job}}"),
                    color="red"),
    ]


def overview() -> dashboard.Dashboard:
    d = _dashboard("dpobs-overview", "dpobs: data-plane overview",
                   "Is the data plane the bottleneck, which op, how long the tail, how "
                   "many bytes, any leak, any corruption.")
    d = d.with_variable(label_variable(
        "job", f"label_values({OP_SERIES}_count, job)", "Job"))
    sections = [("Bottleneck", _frac_panels()), ("Where the time goes", _time_panels()),
                ("Latency", _latency_panels()), ("Volume, occupancy, errors", _volume_panels()),
                ("Codec and instrumentation cost", _cost_panels()),
                ("Wire guard", _guard_panels())]
    return _layout(d, sections)


def _process_quantile(q: float) -> Query:
    expr = f"sum by (instance, op, le) (rate({OP_SERIES}_bucket{PROC}{RI}))"
    return Query(f"histogram_quantile({q}, {expr})", f"{{{{instance}}}} {{{{op}}}} p{q * 100:g}")


def process() -> dashboard.Dashboard:
    d = _dashboard("dpobs-process", "dpobs: process drill-down",
                   "One process at a time: pick job, role and instance.")
    sel = f"{OP_SERIES}_count"
    for name, query, label in (
            ("job", f"label_values({sel}, job)", "Job"),
            ("role", f'label_values({sel}{{job=~"$job"}}, role)', "Role"),
            ("instance", f'label_values({sel}{{job=~"$job", role=~"$role"}}, instance)',
             "Instance")):
        d = d.with_variable(label_variable(name, query, label))
    who = "{{role}} {{instance}}"
    panels = [
        timeseries_panel(
            "Data-plane fraction of step", "This process's data-plane time / step time "
            "over 5m. " + OVERLAP, "percentunit",
            Query(f"instance:dpobs_frac_of_step:ratio_rate5m{PROC}", who)),
        timeseries_panel(
            "Data-plane time by op", "Seconds per second inside client calls, by op, "
            "failed calls included. " + OVERLAP, SECONDS_PER_SECOND,
            Query(f"sum by (role, instance, op) (rate({OP_SERIES}_sum{PROC}{RI}))",
                  who + " {{op}}"), stacked=True),
        timeseries_panel(
            "Latency by op: p50, p99 and mean", "Interpolated inside fixed buckets, so "
            "only as precise as the bucket; noisy when the process makes few calls.", "s",
            _process_quantile(0.5), _process_quantile(0.99),
            Query(f"sum by (instance, op) (rate({OP_SERIES}_sum{PROC}{RI})) / "
                  f"sum by (instance, op) (rate({OP_SERIES}_count{PROC}{RI}))",
                  "{{instance}} {{op}} mean"), log_scale=True),
        timeseries_panel(
            "Bytes per second by op and direction", "This process's side only. " + VOLUME,
            "Bps",
            Query(f"sum by (role, instance, op, direction) "
                  f"(rate(dpobs_client_transferred_bytes_total{PROC}{RI}))",
                  who + " {{op}} {{direction}}")),
        timeseries_panel(
            "Outstanding bytes", "Bytes this process put minus bytes it cleared. Another "
            "process often clears them (then it goes negative there), so judge leaks on "
            "the overview's cluster sum.",
            "bytes", Query(f"sum by (role, instance) (dpobs_client_outstanding_size_bytes{PROC})",
                           who)),
    ]
    return _layout(d, [("Per process", panels)])


def _dashboard(uid: str, title: str, description: str) -> dashboard.Dashboard:
    return (dashboard.Dashboard(title).uid(uid).description(description)
            .tags(["dpobs"]).time("now-1h", "now").refresh("30s").timezone("browser")
            .tooltip(DashboardCursorSync.CROSSHAIR).with_variable(datasource_variable()))


def _layout(d: dashboard.Dashboard, sections: list) -> dashboard.Dashboard:
    panel_id = 0
    for title, panels in sections:
        panel_id += 1
        d = d.with_row(row(title).id(panel_id))
        for panel in panels:
            panel_id += 1
            d = d.with_panel(panel.id(panel_id))
    return d


DASHBOARDS = {"dpobs-overview": overview, "dpobs-process": process}


def render(build) -> str:
    """Sorted and indented, so a regenerated file diffs cleanly against the committed one."""
    return json.dumps(build().build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("dashboards"),
                        help="directory for <uid>.json (default: dashboards)")


def run(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    for uid, build in DASHBOARDS.items():
        path = args.out / f"{uid}.json"
        path.write_text(render(build))
        print(path)
    return 0
