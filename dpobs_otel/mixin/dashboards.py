"""`dpobs dashboards --out DIR`: the Grafana dashboards, generated so they cannot drift.

dpobs-overview answers cluster questions from the recording rules (5m windows, the same
numbers the alerts use); dpobs-process drills into one process from its per-process rules
(fractions of step) and the raw series with `$__rate_interval`.
"""
from __future__ import annotations

import json

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync

from .. import names as n
from .config import DEFAULT, Config
from .queue_panels import queue_panels
from .ray_panels import ray_panels, ray_process_panels, ray_transfer_panels
from .store_panels import store_panels
from .weight_panels import weight_panels
from .panels import (SECONDS_PER_SECOND, Query, checked_stat, counted, dashboard_link,
                     datasource_variable, heatmap_panel, label_variable, row, stat_panel,
                     table_panel, thresholds, timeseries_panel)

RI = "[$__rate_interval]"
OP_SERIES = n.OP_DURATION_SERIES

# Shared reading notes, said once and reused wherever they apply.
OVERLAP = ("Data-plane time is measured around client calls; it can overlap compute when "
           "calls run on other threads, so it bounds the cost, it does not prove a stall.")
VOLUME = ("A byte put by one process and got by another is counted on both sides (write "
          "and read); do not add the directions up as network traffic.")


def _matchers(c: Config, *names: str) -> str:
    """`{job=~"$job", ...}`: one regex matcher per dashboard variable, led by the cluster
    variable when the Config has a cluster label."""
    names = ((c.cluster_label,) if c.cluster_label else ()) + names
    return "{" + ", ".join(f'{label}=~"${label}"' for label in names) + "}"


def _job(c: Config) -> str:
    return _matchers(c, "job")


def _pct(x: float) -> str:
    return f"{x * 100:g}%"


# What each fraction of step time means, one line each (DESIGN.md "Time on the critical
# path"), on every panel that shows it.
EXPOSED = ("Exposed: wall time a step was blocked on the data plane (in a call, in "
           "tel.waiting(), in tel.exposed()); the stall a user pays, what prefetching hides.")
BUSY = ("Busy: wall time, while a step was open, with at least one data-plane call in flight "
        "(any thread), counted once however many overlap.")
OP_SECONDS = ("Op-seconds: the sum of call durations; overlapping calls add up, so it can "
              "exceed 100%. " + OVERLAP)


def _frac_queries(c: Config) -> tuple[Query, ...]:
    """Cluster mean and the slowest process, on both frac_of_step panels."""
    return (Query(f"{n.JOB_FRAC_OF_STEP}{_job(c)}", "{{job}} mean"),
            Query(f"{n.JOB_MAX_FRAC_OF_STEP}{_job(c)}", "{{job}} slowest process"))


def _headline(c: Config) -> list:
    """Exposed, busy and op-seconds side by side: the first question and its three answers."""
    steps = thresholds((None, "green"), (c.frac_of_step_warning, "yellow"),
                       (c.frac_of_step_critical, "red"))  # = the alert's, from one Config
    sel = _job(c)
    exposed = stat_panel(
        "Exposed fraction of step (now)",
        EXPOSED + " Over the last 5m: all processes, and the most stalled one. Yellow at "
        f"{_pct(c.frac_of_step_warning)}, red at {_pct(c.frac_of_step_critical)}, as "
        f"{n.ALERT_DOMINATES_STEP}.", "percentunit",
        Query(f"{n.JOB_EXPOSED_FRAC_OF_STEP}{sel}", "{{job}} mean"),
        Query(f"{n.JOB_MAX_EXPOSED_FRAC_OF_STEP}{sel}", "{{job}} most stalled process"),
        steps=steps, width=8, height=8)
    busy = stat_panel("Busy fraction of step (now)", BUSY + " Over the last 5m, all processes.",
                      "percentunit", Query(f"{n.JOB_BUSY_FRAC_OF_STEP}{sel}", "{{job}}"),
                      color="blue", width=8, height=8)
    op_seconds = stat_panel(
        "Data-plane fraction of step (now)",
        OP_SECONDS + " Over the last 5m: all processes, and the slowest one.", "percentunit",
        *_frac_queries(c), color="purple", width=8, height=8)
    return [exposed, busy, op_seconds]


def _frac_panels(c: Config) -> list:
    sel = _job(c)
    over_time = timeseries_panel(
        "Time on the critical path: exposed, busy and op-seconds",
        "The three fractions of step time over time. " + EXPOSED + " " + BUSY + " "
        + OP_SECONDS + " Exposed far below busy: the loop hides its reads; a most stalled "
        "process far above the mean: one straggler (drill down in dpobs-process).",
        "percentunit",
        Query(f"{n.JOB_EXPOSED_FRAC_OF_STEP}{sel}", "{{job}} exposed"),
        Query(f"{n.JOB_MAX_EXPOSED_FRAC_OF_STEP}{sel}", "{{job}} exposed, most stalled process"),
        Query(f"{n.JOB_BUSY_FRAC_OF_STEP}{sel}", "{{job}} busy"),
        *_frac_queries(c), width=24)
    who = "{{node}} {{instance}} {{role}}"
    exposed = table_panel(
        "Processes by exposed fraction of step",
        "Each process's exposed time / step time over 5m, most stalled first. " + EXPOSED,
        "percentunit",
        Query(f"{n.INSTANCE_EXPOSED_FRAC_OF_STEP}{_matchers(c, 'job', 'node')}", who),
        ["job", "node", "instance", "role"], width=12)
    processes = table_panel(
        "Processes by data-plane fraction of step",
        "Each process's data-plane time / step time over 5m, slowest first. A process is "
        "its node, instance and role: on a cluster two nodes may publish the same "
        "host:port, and they stay two rows. Drill down in dpobs-process.",
        "percentunit",
        Query(f"{n.INSTANCE_FRAC_OF_STEP}{_matchers(c, 'job', 'node')}", who),
        ["job", "node", "instance", "role"], width=12)
    return [*_headline(c), over_time, exposed, processes, *_straggler_panels(c)]


def _straggler_panels(c: Config) -> list:
    """A role's processes side by side by mean latency per op (the outlier stands above its
    role), and the same as a ratio to the role's median (what DpobsDataPlaneStraggler reads)."""
    mean = f"{n.INSTANCE_OP_MEAN}{_matchers(c, 'job', 'node')}"
    role = f"{n.INSTANCE_OP_MEAN}{_job(c)}"  # the role's median over every node
    lines = timeseries_panel(
        "Stragglers: mean latency per process and op",
        "Each process's mean latency of each op over 5m, one line per process; the processes "
        "of a role should sit together, and a straggler stands above them. Log axis.", "s",
        Query(mean, "{{job}} {{role}} {{rank}} {{op}} {{node}} {{instance}}"), log_scale=True)
    ratio = table_panel(
        "Processes by mean latency against their role's median",
        "Each process's mean latency of an op / the median of its role's processes (the "
        f"processes' own included), highest first. {n.ALERT_STRAGGLER} fires at "
        f"{c.straggler_factor:g}x for {c.straggler_for} in a role of "
        f"{c.straggler_min_processes} or more processes.", "suffix: x",
        Query(f"{mean}\n  / {c.on('job', 'role', 'op')} group_left ()\n"
              f"quantile without (node, instance, rank) (0.5, {role})",
              "{{node}} {{instance}} {{role}} {{op}}"),
        ["job", "role", "op", "rank", "node", "instance"], width=12)
    return [lines, ratio]


def _time_panels(c: Config) -> list:
    sel = _job(c)
    by_op = timeseries_panel(
        "Data-plane time by op",
        "Seconds spent inside client calls per second of wall clock, summed over all "
        "processes and stacked by op (2 s/s = two processes busy all the time). "
        "Failed calls are included. " + OVERLAP,
        SECONDS_PER_SECOND,
        Query(f"{n.JOB_OP_SECONDS}{sel}", "{{job}} {{op}}"), stacked=True,
        repeat="job")
    share = timeseries_panel(
        "Share of data-plane time by op",
        "Each op's fraction of all data-plane time; the stack always reaches 100%, so a "
        "growing share can mean the other ops got faster. Read it with the panel on the left.",
        "percentunit",
        Query(f"{n.JOB_OP_SHARE}{sel}", "{{job}} {{op}}"),
        stacked=True, max_value=1, repeat="job")
    ops = timeseries_panel(
        "Operations per second",
        "Completed client calls per second by op, failed ones included. One call may move "
        "many keys, so compare with bytes per second before calling an op chatty.",
        "ops", Query(f"{n.JOB_OP_RATE}{sel}", "{{job}} {{op}}"))
    return [by_op, share, ops]


def _latency_panels(c: Config) -> list:
    sel = _job(c)
    quantiles = timeseries_panel(
        "Latency by op: p50, p90, p99 and mean",
        "native: from the native histogram (exponential buckets 4.4% wide; within ~1-2% of the "
        "truth), where Prometheus has native histograms on. classic: interpolated inside "
        "fixed buckets (0.1 ms to 30 s), only as precise as the bucket they fall in (off by "
        "up to a third), beyond 30 s read as 30 s. Prefer native where both show. The mean "
        "hides tails: trust p99 for stalls.",
        "s",
        Query(f"{n.JOB_OP_NATIVE_QUANTILE}{sel}", "{{job}} {{op}} p{{quantile}} native"),
        Query(f"{n.JOB_OP_QUANTILE}{sel}", "{{job}} {{op}} p{{quantile}} classic"),
        Query(f"{n.JOB_OP_MEAN}{sel}", "{{job}} {{op}} mean"),
        log_scale=True)
    native_heat = heatmap_panel(
        "Latency distribution, native histogram (all ops)",
        "Calls per native bucket per interval (2^(1/16) apart: 4.4% wide), all ops and "
        "processes together. Empty where Prometheus has native histograms off: the classic "
        "heatmap beside it then shows the same, coarser.",
        "s",
        Query(f"sum(increase({n.OP_DURATION_NATIVE_SERIES}{sel}{RI}))", "native"),
        repeat="job")
    heat = heatmap_panel(
        "Latency distribution, classic buckets (all ops)",
        "Calls per bucket per interval, all ops and processes together; the y axis shows "
        "bucket upper bounds. Two bands usually mean two ops or a cache hit/miss split: "
        "filter by op in Explore to tell.",
        "s",
        Query(f"sum by (le) (increase({OP_SERIES}_bucket{sel}{RI}))", "{{le}}"),
        repeat="job")
    return [quantiles, native_heat, heat]


def _volume_panels(c: Config) -> list:
    sel = _job(c)
    volume = timeseries_panel(
        "Bytes per second by op and direction",
        "Tensor payload (exact nbytes) plus msgpack size of other fields. " + VOLUME,
        "Bps",
        Query(f"{n.JOB_OP_DIRECTION_BYTES}{sel}",
              "{{job}} {{op}} {{direction}}"))
    outstanding = timeseries_panel(
        "Outstanding bytes",
        "Bytes written and not yet cleared, as the clients count them. A line that only "
        f"rises is a leak ({n.ALERT_OUTSTANDING_GROWING}); clears made outside the "
        "instrumented client are invisible here and look like one.",
        "bytes", Query(f"{n.JOB_OUTSTANDING_BYTES}{sel}", "{{job}}"))
    errors = timeseries_panel(
        "Error ratio by op",
        "Failed calls / all calls over 5m: 0 when every call succeeded, no data when the "
        "op made no calls. "
        f"Alerts fire at {_pct(c.error_ratio_warning)} and {_pct(c.error_ratio_critical)} "
        f"({n.ALERT_OPERATION_ERRORS}).",
        "percentunit",
        Query(f"{n.JOB_OP_ERROR_RATIO}{sel}",
              "{{job}} {{op}}"))
    return [volume, outstanding, errors]


def _cost_panels(c: Config) -> list:
    sel = _job(c)
    codec = timeseries_panel(
        "Codec time: pack and unpack",
        "Seconds per second spent serializing outside the client (tel.codec blocks). It is "
        "not part of data-plane time, so a fast store can still stall on a slow codec.",
        SECONDS_PER_SECOND,
        Query(f"{n.JOB_STAGE_CODEC_SECONDS}{sel}", "{{job}} {{stage}}"),
        stacked=True, repeat="job")
    overhead = timeseries_panel(
        "Instrumentation overhead",
        "Time dpobs itself spends (measuring, hashing for the guard) as a fraction of "
        f"data-plane time. Above {_pct(c.overhead_info)} raises "
        f"{n.ALERT_OVERHEAD_HIGH}; the wire guard "
        "is usually most of it.",
        "percentunit",
        Query(f"{n.JOB_OVERHEAD_RATIO}{sel}",
              "{{job}}"))
    return [codec, overhead]


def _guard_panels(c: Config) -> list:
    sel = _job(c)
    return [
        checked_stat("Guard: rows checked (5m)",
                    "Rows whose hash was verified on read.",
                    Query(f"{n.JOB_GUARD_CHECKED}{sel}", "{{job}}")),
        checked_stat("Guard: rows unverified",
                    "Rows read with the guard on but no recorded hash to compare "
                    "(written before the guard, or by an unguarded process).",
                    Query(counted(n.GUARD_UNVERIFIED_SERIES, sel), "{{job}}")),
        checked_stat("Guard: fields skipped",
                    "Fields (not rows) the guard could not hash, by count over the "
                    "interval; see the reason label in Explore.",
                    Query(counted(n.GUARD_SKIPPED_SERIES, sel), "{{job}}")),
        checked_stat("Guard: rows mismatched (5m)",
                    "Rows whose bytes differ from what was written: corruption or "
                    f"mis-sharding ({n.ALERT_WIRE_HASH_MISMATCH}). Zero only means clean if rows "
                    "checked is non-zero.",
                    Query(f"{n.JOB_GUARD_MISMATCHED}{sel}", "{{job}}"),
                    color="red"),
    ]


def _variables(c: Config, d: dashboard.Dashboard, *names: str) -> dashboard.Dashboard:
    """Cascading multi-select variables: each lists the values left by the ones before it
    (and by the Config's job selector)."""
    chain = ((c.cluster_label,) if c.cluster_label else ()) + names
    for i, name in enumerate(chain):
        before = [f'{label}=~"${label}"' for label in chain[:i]]
        query = f"label_values({c.sel(OP_SERIES + '_count', *before)}, {name})"
        d = d.with_variable(label_variable(name, query, name.capitalize()))
    return d


def overview(c: Config = DEFAULT) -> dashboard.Dashboard:
    d = _dashboard("dpobs-overview", "dpobs: data-plane overview",
                   "Is the data plane the bottleneck, which op, how long the tail, how "
                   "many bytes, any leak, any corruption. Select several jobs to compare "
                   "them side by side (`dpobs compare` runs one job per backend): every "
                   "legend names the job, and stacked panels repeat once per job. Drill "
                   "down into one process with the dpobs-process link.",
                   dashboard_link("Drill down: one process", "dpobs-process",
                                  "Per-process panels for the jobs selected here"))
    d = _variables(c, d, "job", "node")
    sections = [("Bottleneck", _frac_panels(c)), ("Where the time goes", _time_panels(c)),
                ("Latency", _latency_panels(c)),
                ("Volume, occupancy, errors", _volume_panels(c)),
                ("Codec and instrumentation cost", _cost_panels(c)),
                ("Wire guard", _guard_panels(c)),
                ("Weight sync", weight_panels(c, _job(c), _matchers(c, "job", "node"))),
                ("Who waits for whom: the queue", queue_panels(c, _job(c), _matchers(c, "job", "node"))),
                ("The store's own account", store_panels(c, _job(c))),
                ("Ray object store", ray_panels(c, _job(c), _matchers(c, "job", "node"))),
                ("Ray: where the bytes travel", ray_transfer_panels(c, _job(c)))]
    return _layout(d, sections)


def _process_quantile(q: float, proc: str) -> Query:
    expr = f"sum by (node, instance, op, le) (rate({OP_SERIES}_bucket{proc}{RI}))"
    return Query(f"histogram_quantile({q}, {expr})",
                 f"{{{{node}}}} {{{{instance}}}} {{{{op}}}} p{q * 100:g}")


def process(c: Config = DEFAULT) -> dashboard.Dashboard:
    d = _dashboard("dpobs-process", "dpobs: process drill-down",
                   "One process at a time: pick job, node, role and instance (node is "
                   "empty on a single machine; All matches that too).",
                   dashboard_link("Back to the overview", "dpobs-overview",
                                  "Cluster answers for the jobs selected here"))
    d = _variables(c, d, "job", "node", "role", "instance")
    proc = _matchers(c, "job", "node", "role", "instance")
    who = "{{node}} {{role}} {{instance}}"
    panels = [
        timeseries_panel(
            "Fractions of step: exposed, busy and op-seconds", "This process's exposed, busy "
            "and data-plane (op-seconds) time / step time over 5m. " + EXPOSED + " " + BUSY
            + " " + OP_SECONDS, "percentunit",
            Query(f"{n.INSTANCE_EXPOSED_FRAC_OF_STEP}{proc}", who + " exposed"),
            Query(f"{n.INSTANCE_BUSY_FRAC_OF_STEP}{proc}", who + " busy"),
            Query(f"{n.INSTANCE_FRAC_OF_STEP}{proc}", who + " op-seconds")),
        timeseries_panel(
            "Data-plane time by op", "Seconds per second inside client calls, by op, "
            "failed calls included. " + OVERLAP, SECONDS_PER_SECOND,
            Query(f"sum by (node, role, instance, op) (rate({OP_SERIES}_sum{proc}{RI}))",
                  who + " {{op}}"), stacked=True),
        timeseries_panel(
            "Latency by op: p50, p99 and mean", "Interpolated inside fixed buckets, so "
            "only as precise as the bucket; noisy when the process makes few calls.", "s",
            _process_quantile(0.5, proc), _process_quantile(0.99, proc),
            Query(f"sum by (node, instance, op) (rate({OP_SERIES}_sum{proc}{RI})) / "
                  f"sum by (node, instance, op) (rate({OP_SERIES}_count{proc}{RI}))",
                  "{{node}} {{instance}} {{op}} mean"), log_scale=True),
        timeseries_panel(
            "Bytes per second by op and direction", "This process's side only. " + VOLUME,
            "Bps",
            Query(f"sum by (node, role, instance, op, direction) "
                  f"(rate({n.TRANSFERRED_SERIES}{proc}{RI}))",
                  who + " {{op}} {{direction}}")),
        timeseries_panel(
            "Outstanding bytes", "Bytes this process put minus bytes it cleared. Another "
            "process often clears them (then it goes negative there), so judge leaks on "
            "the overview's cluster sum.",
            "bytes", Query("sum by (node, role, instance) "
                           f"({n.OUTSTANDING_SIZE_SERIES}{proc})", who)),
    ]
    return _layout(d, [("Per process", panels),
                       ("Ray ops by method", ray_process_panels(c, proc))])


def _dashboard(uid: str, title: str, description: str, link) -> dashboard.Dashboard:
    return (dashboard.Dashboard(title).uid(uid).description(description)
            .tags(["dpobs"]).time("now-1h", "now").refresh("30s").timezone("browser")
            .tooltip(DashboardCursorSync.CROSSHAIR).with_variable(datasource_variable())
            .link(link))


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


def render(build, c: Config = DEFAULT) -> str:
    """Sorted and indented, so a regenerated file diffs cleanly against the committed one."""
    return json.dumps(build(c).build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


def build_dashboards(c: Config = DEFAULT) -> dict[str, str]:
    """File name -> JSON text."""
    return {f"{uid}.json": render(build, c) for uid, build in DASHBOARDS.items()}
