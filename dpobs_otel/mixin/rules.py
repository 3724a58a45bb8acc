"""The recording rules (names pinned in DESIGN.md), built from the mixin's Config.

Conventions:
- Ratios sum numerator and denominator separately, then divide; averaging per-process
  ratios would weight an idle process like a busy one.
- Denominators are filtered with `> 0`, so a job or process with no steps or no traffic has
  no sample instead of NaN or +Inf.
- rate()/increase() absorb counter resets, so a restarted process does not dip or spike.
- One group: rules are evaluated in order, so later rules read this cycle's earlier ones.
"""
from __future__ import annotations

from .config import Config
from .render import Group, Rule, rule_file

OP = "dpobs_client_operation_duration_seconds"
QUANTILES = ("0.5", "0.9", "0.99")
# The labels that name one process: two processes on different nodes may publish the same
# host:port, so instance alone is not enough (DESIGN.md "Cluster deployment").
PROCESS = ("job", "node", "instance", "role")


def _rate(c: Config, metric: str, *labels: str, window: str = "5m") -> str:
    return f"sum {c.by(*labels)} (rate({c.sel(metric)}[{window}]))"


def _born_or_increase(c: Config, metric: str, window: str) -> str:
    """Increase over the window, counting a series first seen inside it in full: a counter
    is born at its first increment and increase() needs two samples."""
    s = c.sel(metric)
    return f"({s} unless {s} offset {window})\n  or increase({s}[{window}])"


def _time_rules(c: Config) -> list[Rule]:
    rec = [Rule({"record": f"job_role_op:{OP}:rate5m", "expr": _rate(c, f"{OP}_sum", "job", "role", "op")},
                "Data-plane seconds spent per second of wall time (includes failed calls).")]
    rec += [Rule({"record": f"job_op:{OP}:rate5m", "expr": _rate(c, f"{OP}_sum", "job", "op")}),
            Rule({"record": f"job:{OP}:rate5m", "expr": _rate(c, f"{OP}_sum", "job")}),
            Rule({"record": "job:dpobs_step_duration_seconds:rate5m",
                  "expr": _rate(c, "dpobs_step_duration_seconds_sum", "job")})]
    return rec


def _frac_rules(c: Config) -> list[Rule]:
    per_process = (f"{_rate(c, f'{OP}_sum', *PROCESS)}\n"
                   f"  / ({_rate(c, 'dpobs_step_duration_seconds_sum', *PROCESS)} > 0)")
    return [
        Rule({"record": "job:dpobs_frac_of_step:ratio_rate5m",
              "expr": f"job:{OP}:rate5m\n  / (job:dpobs_step_duration_seconds:rate5m > 0)\n"},
             "Fraction of step time spent in the data plane."),
        Rule({"record": "instance:dpobs_frac_of_step:ratio_rate5m", "expr": per_process + "\n"},
             "The same per process: one series per " + ", ".join(PROCESS) + "."),
        Rule({"record": "job:dpobs_frac_of_step:max_ratio_rate5m",
              "expr": f"max {c.by('job')} (instance:dpobs_frac_of_step:ratio_rate5m)"}),
        Rule({"record": "job_op:dpobs_operation_share:ratio_rate5m",
              "expr": f"job_op:{OP}:rate5m\n  / {c.on('job')} group_left ()\n"
                      f"(job:{OP}:rate5m > 0)\n"}),
    ]


def _latency_rules(c: Config) -> list[Rule]:
    out = [Rule({"record": "job_op:dpobs_client_operations:rate5m",
                 "expr": _rate(c, f"{OP}_count", "job", "op")}),
           Rule({"record": f"job_op:{OP}:mean_rate5m",
                 "expr": f"job_op:{OP}:rate5m\n  / (job_op:dpobs_client_operations:rate5m > 0)\n"})]
    buckets = f"job_op_le:{OP}_bucket:rate5m"
    out.append(Rule({"record": buckets, "expr": _rate(c, f"{OP}_bucket", "job", "op", "le")},
                    "Buckets add across processes because every process uses the same bounds.\n"
                    "Recorded once for the three quantiles below (it is most of their cost)."))
    for i, q in enumerate(QUANTILES):
        why = "histogram_quantile is NaN without observations; `and` drops those." if i == 0 else ""
        out.append(Rule({
            "record": f"job_op:{OP}:quantile_rate5m",
            "expr": f"histogram_quantile({q}, {buckets})\n"
                    f"  and {c.on('job', 'op')} (job_op:dpobs_client_operations:rate5m > 0)\n",
            "labels": {"quantile": q}}, why))
    return out


def _volume_rules(c: Config) -> list[Rule]:
    errors = (f"(\n  {_rate(c, 'dpobs_client_operation_errors_total', 'job', 'op')}\n"
              f"    or job_op:dpobs_client_operations:rate5m * 0\n)\n"
              f"  / (job_op:dpobs_client_operations:rate5m > 0)\n")
    return [
        Rule({"record": "job_op_direction:dpobs_client_transferred_bytes:rate5m",
              "expr": _rate(c, "dpobs_client_transferred_bytes_total", "job", "op", "direction")}),
        Rule({"record": "job_op:dpobs_client_operation_errors_per_operations:ratio_rate5m",
              "expr": errors},
             "The errors counter only exists after a first error; `or ... * 0` reports 0 for ops\n"
             "that ran cleanly rather than no data."),
        Rule({"record": "job:dpobs_client_outstanding_size_bytes:sum",
              "expr": f"sum {c.by('job')} ({c.sel('dpobs_client_outstanding_size_bytes')})"},
             "Occupancy of the store as this job sees it: what every process holds, summed."),
        Rule({"record": "job_stage:dpobs_codec_duration_seconds:rate5m",
              "expr": _rate(c, "dpobs_codec_duration_seconds_sum", "job", "stage")}),
        Rule({"record": "job:dpobs_instrumentation_time_per_operation_time:ratio_rate5m",
              "expr": f"{_rate(c, 'dpobs_instrumentation_time_seconds_total', 'job')}\n"
                      f"  / (job:{OP}:rate5m > 0)\n"}),
    ]


def _guard_rules(c: Config) -> list[Rule]:
    def counted(metric: str) -> str:
        body = _born_or_increase(c, metric, "5m").replace("\n", "\n  ")
        return f"sum {c.by('job')} (\n  {body}\n)"
    return [
        Rule({"record": "job:dpobs_guard_rows_checked:increase5m",
              "expr": counted("dpobs_guard_rows_checked_total") + "\n"},
             "Wire guard. A counter is born at its first increment (value >= 1) and increase()\n"
             "needs two samples, so a series first seen in the window counts its whole value;\n"
             "otherwise a single corrupted row would never show up."),
        Rule({"record": "job:dpobs_guard_rows_mismatched:increase5m",
              "expr": counted("dpobs_guard_rows_mismatched_total")
              + "\n  or job:dpobs_guard_rows_checked:increase5m * 0\n"}),
    ]


AGENT_LAST_SAMPLE = "node:dpobs_agent_last_sample_timestamp_seconds:max"


def _agent_rules(c: Config) -> list[Rule]:
    up = c.sel("up", 'node!=""')
    return [Rule(
        {"record": AGENT_LAST_SAMPLE, "expr": f"max {c.by('node')} (timestamp({up}))"},
        "Cluster: when each node's agent last delivered a sample (every series an agent sends\n"
        "carries `node`, its own `up` included). A killed agent writes no staleness markers,\n"
        "so its series stay visible for 5m; their sample timestamps tell the truth, and\n"
        "DpobsAgentDown reads this over a longer window than the lookback.")]


def recording_groups(c: Config) -> list[Group]:
    rules = (_time_rules(c) + _frac_rules(c) + _latency_rules(c) + _volume_rules(c)
             + _guard_rules(c) + _agent_rules(c))
    return [Group("dpobs-recording", rules)]


HEADER = """\
Recording rules for dpobs-otel, generated by `dpobs mixin` from dpobs_otel/mixin/rules.py
(do not edit: change the generator or its Config). Names follow level:metric:operations and
are pinned in DESIGN.md; dashboards and alerts read these, not the raw series.

""" + (__doc__ or "").split("\n", 2)[2]


def recording_file(c: Config) -> str:
    return rule_file(HEADER, recording_groups(c))
