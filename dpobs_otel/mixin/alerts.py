"""The alerts (names and severities pinned in DESIGN.md), built from the mixin's Config: every
threshold and `for:` comes from there, and the table at the top of the generated file is
written from the same values. Each alert has a section in docs/runbook.md, which its
absolute runbook_url points at. Most alerts read the recording rules of rules.py.

Counters are born at their first increment and increase() needs two samples, so the "any
event" alerts also match a series first seen in the window (`x > 0 unless x offset w`);
without that, a single corrupted row or guard failure would never alert.
"""
from __future__ import annotations

from .. import names as n
from ..agent.config import SELF_JOB
from .config import Config
from .ray_alerts import ray_alerts
from .render import Group, Rule, rule_file
from .render import alert as _alert
from .rules import RECEIVE, SEND, counted

OVERFLOW = n.COMPONENT_OVERFLOW
PROC = "{{ $labels.role }} rank {{ $labels.rank }} ({{ $labels.instance }}, job {{ $labels.job }})"


def _any_event(c: Config, metric: str, window: str, *matchers: str) -> str:
    s = c.sel(metric, *matchers)
    return f"(increase({s}[{window}]) > 0)\n  or\n({s} > 0 unless {s} offset {window})\n"


def _guard(c: Config) -> list[Rule]:
    def rows(metric: str) -> str:
        return f"sum {c.by('job')} (increase({c.sel(metric)}[30m])) > 0"
    blind = (f"(\n  {rows(n.GUARD_RECORDED_SERIES)}\n"
             f"    or\n  {rows(n.GUARD_UNVERIFIED_SERIES)}\n)\n"
             f"unless {c.on('job')}\n({rows(n.GUARD_CHECKED_SERIES)})\n")
    return [
        _alert(c, n.ALERT_WIRE_HASH_MISMATCH, "critical",
               _any_event(c, n.GUARD_MISMATCHED_SERIES, "5m"), None,
               "Rows read from the data plane do not match the hash recorded when they were written.",
               "{{ $value | humanize }} row(s) of field {{ $labels.field }} read by " + PROC
               + " failed the wire hash check in the last 5m. Training may be consuming"
               " corrupted or mis-sharded data.",
               "No `for:`: one corrupted row already is an incident."),
        _alert(c, n.ALERT_GUARD_ALL_MISMATCHED, "warning",
               f"{n.JOB_GUARD_MISMATCHED} >= {n.JOB_GUARD_CHECKED}\n"
               f"  and\n{n.JOB_GUARD_CHECKED} > 0\n", c.guard_all_mismatched_for,
               "Every row the wire guard checked mismatched; the guard itself is the likely fault.",
               "All {{ $value | humanize }} rows checked in job {{ $labels.job }} in the last 5m"
               " failed the hash check, and this has persisted. Compare writer and reader"
               " versions of dpobs-otel and torch before treating this as corruption.",
               "A guard bug (or writer and reader hashing differently) mismatches every row; real\n"
               "corruption rarely does for long. The long `for:` keeps one bad batch out of here."),
        _alert(c, n.ALERT_GUARD_FAILING, "warning",
               _any_event(c, n.GUARD_FAILURES_SERIES, "10m"), c.guard_failing_for,
               "The wire guard raised while hashing or checking rows; those rows are not verified.",
               "The wire guard in " + PROC + " raised {{ $labels.error_type }}"
               " {{ $value | humanize }} time(s) in the last 10m."),
        _alert(c, n.ALERT_GUARD_BLIND, "warning", blind, c.guard_blind_for,
               "The wire guard is on but checks no rows.",
               "Job {{ $labels.job }} recorded hashes for (or read without one)"
               " {{ $value | humanize }} rows in the last 30m but checked none, so corruption"
               " would go unnoticed.",
               "Writers record and readers check, usually in different processes, so this is per job."),
    ]


def _query(expr: str, *args: str) -> str:
    """A Go-template query of another series from an alert's description."""
    return f'printf "{expr}" {" ".join(args)} | query'


def _dominates(c: Config, severity: str, threshold: float) -> Rule:
    stalled = _query(n.JOB_MAX_EXPOSED_FRAC_OF_STEP + "{job=%q}", "$labels.job")
    top_op = _query(f"topk(1, {n.JOB_OP_SHARE}" + "{job=%q})", "$labels.job")
    return _alert(
        c, n.ALERT_DOMINATES_STEP, severity,
        f"{n.JOB_EXPOSED_FRAC_OF_STEP} > {threshold:g}", c.frac_of_step_for,
        "Training steps spend a large share of their time waiting on the data plane.",
        "Job {{ $labels.job }}'s steps are blocked on the data plane for"
        " {{ $value | humanizePercentage }} of their time; the most stalled process for"
        " {{ with " + stalled + " }}{{ . | first | value | humanizePercentage }}{{ end }},"
        " and op {{ with " + top_op + " }}{{ with . | first }}{{ .Labels.op }} takes"
        " {{ .Value | humanizePercentage }}{{ end }}{{ end }} of data-plane time.",
        "Exposed time, not op-seconds: a prefetch that hides its reads behind compute is\n"
        "no bottleneck. For a synchronous job the two are the same number.",
        threshold=f">{threshold:g}")


def _straggler(c: Config) -> Rule:
    """One process of a role much slower per call than the role's median (3+ processes:
    with two, neither is the odd one out)."""
    mean, role = n.INSTANCE_OP_MEAN, c.on("job", "role", "op")
    by_role = c.by("job", "role", "op")
    expr = (f"{mean}\n  / {role} group_left ()\n"
            f"(quantile {by_role} (0.5, {mean}) > 0)\n"
            f">= {c.straggler_factor:g}\n"
            f"and {role}\n"
            f"(count {by_role} ({mean}) >= {c.straggler_min_processes})\n")
    return _alert(
        c, n.ALERT_STRAGGLER, "warning", expr, c.straggler_for,
        "One process's data-plane calls are much slower than the rest of its role's.",
        "{{ $labels.op }} calls by " + PROC + " take {{ $value | printf \"%.3g\" }}x as long"
        " on average as the median of its role's processes.",
        "The value is the ratio to the role's median (the median includes the straggler, so\n"
        "one slow process cannot drag it up); it carries the process's labels. The\n"
        "description runs no query: Prometheus expands it for every pending and firing series\n"
        "at every evaluation, so a query in it costs one query per straggling process per\n"
        "cycle (docs/development/scaling.md); the process's own mean is on the dashboard.",
        threshold=f">={c.straggler_factor:g}")


def _errors(c: Config, severity: str, threshold: float, for_: str) -> Rule:
    top = _query(f"topk(1, sum by (error_type) (rate({n.OP_ERRORS_SERIES}"
                 "{job=%q,op=%q}[5m])))", "$labels.job", "$labels.op")
    return _alert(
        c, n.ALERT_OPERATION_ERRORS, severity, f"{n.JOB_OP_ERROR_RATIO} > {threshold:g}",
        for_, "Data-plane calls are failing.",
        "{{ $value | humanizePercentage }} of {{ $labels.op }} calls in job {{ $labels.job }}"
        " failed over the last 5m, most often with {{ with " + top
        + ' }}{{ . | first | label "error_type" }}{{ end }}.', threshold=f">{threshold:g}")


def _data_plane(c: Config) -> list[Rule]:
    outstanding = _query(n.JOB_OUTSTANDING_BYTES + "{job=%q}", "$labels.job")
    return [
        _dominates(c, "warning", c.frac_of_step_warning),
        _dominates(c, "critical", c.frac_of_step_critical),
        _straggler(c),
        _errors(c, "warning", c.error_ratio_warning, c.error_ratio_warning_for),
        _errors(c, "critical", c.error_ratio_critical, c.error_ratio_critical_for),
        _alert(c, n.ALERT_OUTSTANDING_GROWING, "warning",
               f"deriv({n.JOB_OUTSTANDING_BYTES}[1h]) > 0\n  and\n"
               f"{n.JOB_OUTSTANDING_BYTES} > {c.outstanding_bytes_floor}\n",
               c.outstanding_for,
               "Bytes held in the data plane keep growing; something puts without clearing.",
               "Outstanding bytes in job {{ $labels.job }} keep rising, by"
               " {{ $value | humanize1024 }}B/s over the last hour, to {{ with " + outstanding
               + " }}{{ . | first | value | humanize1024 }}B{{ end }}.",
               "Steady state oscillates around a level (puts and clears balance); a leak only rises.",
               threshold=f">{c.outstanding_bytes_floor}"),
    ]


def _targets(c: Config) -> list[Rule]:
    return [_alert(
        c, n.ALERT_TARGET_DOWN, "warning", c.sel("up", 'role!=""') + " == 0", c.target_down_for,
        "A registered dpobs process cannot be scraped.",
        "Prometheus cannot scrape {{ $labels.role }} rank {{ $labels.rank }} at"
        " {{ $labels.instance }} (job {{ $labels.job }}). Its file_sd entry is still present,"
        " so the process likely died without shutdown() or hangs.",
        "Only file_sd-registered processes carry `role`; this works for any job name.",
        threshold="==0")]


def _agent_down(c: Config) -> Rule:
    last = n.NODE_AGENT_LAST_SAMPLE
    age, stale = f"time() - {last}", c.agent_stale_seconds
    expr = (f"time() - max_over_time({last}[1h]) > {stale}\n"
            f"  and {c.on()}\n"
            f"(count {c.by()} ({age} <= {stale}) > 0)\n")
    return _alert(
        c, n.ALERT_AGENT_DOWN, "warning", expr, c.agent_down_for,
        "A node's dpobs agent stopped delivering samples.",
        "No sample from node {{ $labels.node }} has arrived for {{ $value | humanizeDuration }}"
        " while other nodes still deliver: its `dpobs agent` (or the node) is down, or cannot"
        " reach the remote-write receiver. Its processes' series are frozen at their last"
        " values.",
        "Freshness from sample timestamps, over 1h so the alert outlives the 5m lookback of a\n"
        "killed agent's series. Only while some other node is fresh: when every node is stale,\n"
        "the central side (or the whole job) stopped, which is not this node's fault.",
        threshold=f">{stale}")


def _agent_delivery(c: Config) -> Rule:
    # The agent's own series (its self-scrape, job dpobs-agent) ride its classic queue, so
    # they arrive while its native queue is the one failing.
    agent = f'job="{SELF_JOB}"'
    per = c.by("node", "remote_name")

    def total(fn: str, *suffixes: str) -> str:
        # one sum per metric, added: rate() over a regex on __name__ drops the names and
        # leaves samples and histograms of a queue with one labelset, an error
        def one(metric: str) -> str:
            return f"{fn}({metric}[{c.agent_delivery_window}])" if fn else metric
        return "\n  + ".join(
            f"sum {per} ({one(f'prometheus_remote_storage_{kind}_{suffix}{{{agent}}}')})"
            for suffix in suffixes for kind in ("samples", "histograms"))
    failing = f"(\n    {total('rate', 'failed_total', 'retried_total')}\n) > 0"
    behind = (f"(\n    max {c.by('node')} (prometheus_remote_storage_highest_timestamp_in_seconds"
              f"{{{agent}}})\n  - {c.on('node')} group_right\n"
              f"    max {per} (prometheus_remote_storage_queue_highest_sent_timestamp_seconds"
              f"{{{agent}}})\n) > {c.agent_delivery_lag_seconds}\n"
              f"  and {c.on('node', 'remote_name')}\n(\n    {total('', 'pending')}\n) > 0")
    return _alert(
        c, n.ALERT_AGENT_DELIVERY_FAILING, "warning", f"{failing}\n  or\n{behind}\n",
        c.agent_delivery_for,
        "A node's dpobs agent is up but its remote writes fail, are refused or fall behind.",
        "Queue {{ $labels.remote_name }} of the agent on node {{ $labels.node }} has had"
        " failed or retried sends, or is behind by more than"
        f" {c.agent_delivery_lag_seconds} s with samples pending, for {c.agent_delivery_for}."
        " Its log names the receiver's answer; the samples wait in its WAL.",
        "Retries over the window catch a receiver that refuses every batch (a 5xx is retried\n"
        "forever, and samples_failed_total stays 0); the lag catches one that accepts too\n"
        "slowly. An idle queue (nothing pending) is never behind. A short receiver outage\n"
        "retries for less than the window plus `for:` and stays silent.")


def _instrumentation(c: Config) -> list[Rule]:
    top = _query(f"topk(1, sum by (component) (rate({n.INSTR_TIME_SERIES}"
                 "{job=%q}[5m])))", "$labels.job")
    return [
        _alert(c, n.ALERT_OVERHEAD_HIGH, "info",
               f"{n.JOB_OVERHEAD_RATIO} > {c.overhead_info:g}", c.overhead_for,
               "Instrumentation costs a noticeable share of data-plane time.",
               "Instrumentation in job {{ $labels.job }} takes {{ $value | humanizePercentage }}"
               " of data-plane time, mostly in component {{ with " + top
               + ' }}{{ . | first | label "component" }}{{ end }}.',
               threshold=f">{c.overhead_info:g}"),
        _alert(c, n.ALERT_INSTRUMENTATION_ERRORS, "warning",
               _any_event(c, n.INSTR_ERRORS_SERIES, "10m", f'component!="{OVERFLOW}"'),
               c.instrumentation_errors_for,
               "The instrumentation swallowed errors; some metrics are missing or wrong.",
               "Component {{ $labels.component }} in " + PROC + " swallowed"
               " {{ $value | humanize }} error(s) in the last 10m.",
               f"Not component {OVERFLOW}: no error of dpobs's code, it has an alert of its own."),
        _alert(c, n.ALERT_CARDINALITY_OVERFLOW, "warning",
               _any_event(c, n.INSTR_ERRORS_SERIES, "10m", f'component="{OVERFLOW}"'), None,
               "A process folded label sets into the OpenTelemetry SDK's overflow series;"
               " queries over its series undercount.",
               "An instrument of " + PROC + " is past the SDK's cardinality limit (2000 label"
               " sets per instrument by default): {{ $value | humanize }} collection(s) in the"
               " last 10m folded label sets into one otel_metric_overflow=\"true\" series. Its"
               " log names the instrument.",
               "No `for:`: every collection of a folded instrument counts, so the count rises\n"
               "as long as the process lives; a fold is data already lost."),
        _unmeasured(c),
    ]


def _unmeasured(c: Config) -> Rule:
    def rate(record: str) -> str:
        return _first(_query(record + "{job=%q,op=%q}", "$labels.job", "$labels.op"),
                      'printf "%.3g"', "/s")
    return _alert(
        c, n.ALERT_UNMEASURED_CLIENTS, "warning",
        f"{n.JOB_OP_STORE_COVERAGE} < {c.unmeasured_coverage:g}", c.unmeasured_for,
        "The store serves more requests than the measured clients made: some process moves"
        " data without dpobs.",
        "In job {{ $labels.job }} the measured clients made {{ $value | humanizePercentage }}"
        " of the {{ $labels.op }} calls the store served (made " + rate(n.JOB_OP_STORE_MADE)
        + ", served " + rate(n.JOB_OP_STORE_SERVED) + "). The rest come from processes dpobs"
        " does not measure; their time, bytes and errors are in no dpobs series.",
        "Per job and op (get pools get and get_data): the op points at the unmeasured role.",
        threshold=f"<{c.unmeasured_coverage:g}")


def _first(query: str, pipe: str, unit: str = "") -> str:
    """The first value a description's query answers, through `pipe`; nothing if none."""
    return "{{ with " + query + " }}{{ . | first | value | " + pipe + " }}" + unit + "{{ end }}"


def _weights(c: Config) -> list[Rule]:
    version, lag = n.WEIGHTS_VERSION_SERIES, c.weights_stale_versions
    held = _query(version + "{job=%q,node=%q,instance=%q,role=%q,rank=%q,side=%q}",
                  *(f"$labels.{label}" for label in (*n.PROCESS_IDENTITY, "side")))

    def sender(record: str) -> str:  # a per-job record of the send side
        return _query(record + "{job=%q,side=%q}", "$labels.job", f'"{n.WEIGHT_SIDES[0]}"')
    slowest = _query(n.JOB_WEIGHTS_SYNC_MAX_MEAN + "{job=%q}", "$labels.job")
    return [
        _alert(c, n.ALERT_WEIGHTS_MISMATCH, "critical",
               counted(c, n.WEIGHTS_MISMATCHED_SERIES, "job", "reason") + " > 0\n", None,
               "A receiver's weights differ from what the trainer sent for that version.",
               "{{ $value | humanize }} weight tensor(s) received in job {{ $labels.job }}"
               " failed the check against the sender's fingerprints in the last 5m, reason"
               " {{ $labels.reason }} (value: differs from what was sent; missing: sent, not"
               " received; unexpected: received, not sent). Rollouts may be generated with"
               " weights the trainer never had.",
               "No `for:`: one wrong tensor already is an incident. Per job and reason: the\n"
               "receivers of one sync fail together, and the reason points at the cause."),
        _alert(c, n.ALERT_WEIGHTS_STALE, "warning",
               f"max {c.by('job')} ({c.sel(version, SEND)})\n"
               f"  - {c.on('job')} group_right ()\n"
               f"{c.sel(version, RECEIVE)}\n> {lag}\n", c.weights_stale_for,
               "A weight receiver is behind the version its job's trainer sent.",
               PROC + " holds weight version " + _first(held, 'printf "%.0f"')
               + ', {{ $value | printf "%.0f" }} behind the newest version its job\'s sender'
               f" completed; the job may run {lag} behind.",
               "The value is the lag in versions and carries the receiver's labels. Against the\n"
               "job's newest sender: with several sending ranks, the one that finished last.",
               threshold=f">{lag}"),
        _alert(c, n.ALERT_WEIGHT_SYNC_SLOW, "warning",
               f"{n.JOB_WEIGHT_SYNC_FRAC_OF_STEP} > {c.weight_sync_slow_frac:g}",
               c.weight_sync_slow_for,
               "Weight sync takes a large share of the trainer's step time.",
               "Weight sync takes {{ $value | humanizePercentage }} of the step time of job"
               " {{ $labels.job }}'s syncing processes; a send takes "
               + _first(sender(n.JOB_SIDE_WEIGHTS_SYNC_MEAN), "humanizeDuration")
               + " on average, at "
               + _first(sender(n.JOB_SIDE_WEIGHTS_BANDWIDTH), "humanize", "B/s")
               + ", the slowest receiver " + _first(slowest, "humanizeDuration") + ".",
               threshold=f">{c.weight_sync_slow_frac:g}"),
    ]


def _rule_evaluation(c: Config) -> Rule:
    """Prometheus's own series of its rule groups (its self-scrape: the shipped configs have
    one). vmalert and Mimir's ruler export other names; docs/runbook.md says what to use."""
    groups = f'rule_group=~"{c.rule_groups}"'
    slow = (f"prometheus_rule_group_last_duration_seconds{{{groups}}}\n"
            f"  > {c.on('instance', 'job', 'rule_group')}\n"
            f"prometheus_rule_group_interval_seconds{{{groups}}}\n")
    missed = (f"increase(prometheus_rule_group_iterations_missed_total{{{groups}}}"
              f"[{c.rule_evaluation_missed_window}]) > 0\n")
    return _alert(
        c, n.ALERT_RULE_EVALUATION_SLOW, "warning", f"(\n{slow})\n  or\n(\n{missed})\n",
        c.rule_evaluation_slow_for,
        "A dpobs rule group takes longer than its interval to evaluate, or skips evaluations;"
        " its records and alerts come late or not at all.",
        "Rule group {{ $labels.rule_group }} of {{ $labels.instance }} (job {{ $labels.job }})"
        " took {{ $value | humanize }} (seconds of its last evaluation, or evaluations missed"
        f" in the last {c.rule_evaluation_missed_window}) against its interval. Alerts that"
        " read its records fire late, or miss short events.",
        "A group of its own and light: Prometheus evaluates each group on its own schedule,\n"
        "so this one keeps its interval while a heavy one falls behind. Slower than the\n"
        "interval for `for:` (one slow evaluation is noise), or any evaluation skipped (the\n"
        "table's >0: the missed count's; the duration is compared with the group's interval).")


def alert_groups(c: Config) -> list[Group]:
    return [Group("dpobs-wire-guard", _guard(c)), Group("dpobs-data-plane", _data_plane(c)),
            Group("dpobs-targets", _targets(c) + [_agent_down(c), _agent_delivery(c)]),
            Group("dpobs-instrumentation", _instrumentation(c)),
            Group("dpobs-weights", _weights(c)), Group("dpobs-ray", ray_alerts(c)),
            Group("dpobs-monitoring", [_rule_evaluation(c)])]


def _table(groups: list[Group]) -> str:
    """alert / severity / threshold / for: the one table a reader checks thresholds in."""
    rows = [("alert", "severity", "threshold", "for")]
    for g in groups:
        for r in g.rules:
            b = r.body
            rows.append((b["alert"], b["labels"]["severity"], r.threshold, b.get("for", "-")))
    width = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(f"  {a:<{width[0]}}  {s:<{width[1]}}  {t:<{width[2]}}  {f}"
                     for a, s, t, f in rows)


def alerts_file(c: Config) -> str:
    groups = alert_groups(c)
    header = ("Alerts for dpobs-otel, generated by `dpobs mixin` from dpobs_otel/mixin/alerts.py\n"
              "(do not edit: change the generator or its Config). Thresholds and `for:` come from\n"
              "the Config; \"-\" = fires on the first evaluation.\n\n" + _table(groups) + "\n\n"
              + (__doc__ or "").split("\n\n", 1)[1])
    return rule_file(header, groups)
