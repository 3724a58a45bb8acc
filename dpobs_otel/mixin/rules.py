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

from .. import names as n
from .config import Config
from .ray_rules import ray_rules
from .render import Group, Rule, rule_file
from .store_rules import store_rules

OP = n.OP_DURATION_SERIES
NATIVE = n.OP_DURATION_NATIVE_SERIES
# Rules that read native histograms. promtool 2.42 cannot take a native histogram as test
# input (the notation came in 2.47), so these are tested against a real Prometheus instead
# (tests/exporters/test_native_live.py LIVE_CHECKS), and tests/mixin/test_rules.py holds
# every other rule to a promtool test.
NATIVE_RULES = (n.JOB_OP_NATIVE_QUANTILE,)
STEP = n.STEP_DURATION_SERIES
PROCESS = n.PROCESS_IDENTITY  # per-process rules keep one series per process


def _rate(c: Config, metric: str, *labels: str, window: str = "5m",
          where: tuple[str, ...] = ()) -> str:
    """`where`: matchers beyond the job selector, e.g. ('side="receive"',)."""
    return f"sum {c.by(*labels)} (rate({c.sel(metric, *where)}[{window}]))"


def _born_or_increase(c: Config, metric: str, window: str, where: tuple[str, ...]) -> str:
    """Increase over the window, counting a series first seen inside it in full: a counter
    is born at its first increment and increase() needs two samples."""
    s = c.sel(metric, *where)
    return f"({s} unless {s} offset {window})\n  or increase({s}[{window}])"


def counted(c: Config, metric: str, *labels: str, window: str = "5m",
            where: tuple[str, ...] = ()) -> str:
    """A counter's events in the window summed by `labels`, series born in it counted whole
    (the guard's records, the weight-mismatch alert, `dpobs top` read it alike); `where`:
    matchers beyond the job selector."""
    body = _born_or_increase(c, metric, window, where).replace("\n", "\n  ")
    return f"sum {c.by(*labels)} (\n  {body}\n)"


def data_plane_seconds(c: Config, *labels: str) -> str:
    """Data-plane seconds per second summed by `labels`: the whole duration of every op
    but Ray's, and of Ray's ops only their moving-data part (dpobs_ray_data_seconds_total:
    a ray_get's wait for the remote method is not data-plane time). The two never share a
    label set (their ops differ), so `or` is their union."""
    ops, ray = c.sel(f"{OP}_sum", c.data_plane_ops), c.sel(n.RAY_DATA_SERIES)
    return f"sum {c.by(*labels)} (\n  rate({ops}[5m])\n    or\n  rate({ray}[5m])\n)"


def stepping(c: Config, expr: str) -> str:
    """`expr` (per process) kept for the processes that run steps: a process without steps
    (a verl worker under zero code, on Ray or on TransferQueue) is in no frac_of_step
    numerator, on any plane (DESIGN.md, "Moving data versus waiting (Ray)")."""
    return f"{expr}\n  and {c.on(*PROCESS)}\n{c.sel(f'{STEP}_sum')}"


def _time_rules(c: Config) -> list[Rule]:
    rec = [Rule({"record": n.JOB_ROLE_OP_SECONDS,
                 "expr": data_plane_seconds(c, "job", "role", "op") + "\n"},
                "Data-plane seconds spent per second of wall time (includes failed calls); of\n"
                "Ray's ops only their moving-data part, from every process (the per-op share\n"
                "and the per-method accounts count workers without steps too).")]
    # Each coarser sum is taken over the finer record, not over the raw series again: a
    # scrape committed between two rules of one evaluation moved a second rate() of the same
    # counters, and the ops' shares then summed to 1.0105 (dpobs compare, TransferQueue).
    rec += [Rule({"record": n.JOB_OP_SECONDS,
                  "expr": f"sum {c.by('job', 'op')} ({n.JOB_ROLE_OP_SECONDS})"}),
            Rule({"record": n.JOB_SECONDS, "expr": f"sum {c.by('job')} ({n.JOB_OP_SECONDS})"}),
            Rule({"record": n.JOB_STEP_SECONDS, "expr": _rate(c, f"{STEP}_sum", "job")})]
    return rec


def per_process(c: Config, numerator: str, where: tuple[str, ...] = ()) -> str:
    """A counter's rate over step time, one series per process (the process identity)."""
    return over_steps(c, _rate(c, numerator, *PROCESS, where=where))


def over_steps(c: Config, rate: str) -> str:
    """A per-process rate over that process's step time (a process without steps: none)."""
    return f"{rate}\n  / ({_rate(c, f'{STEP}_sum', *PROCESS)} > 0)\n"


def stepping_seconds(c: Config, *labels: str) -> str:
    """Data-plane seconds per second of the processes that run steps, summed by `labels`
    (frac_of_step's numerator; the node tier sums it per node, node_tier.py)."""
    steppers = stepping(c, data_plane_seconds(c, *PROCESS)).replace("\n", "\n  ")
    return f"sum {c.by(*labels)} (\n  {steppers}\n)"


def _frac_rules(c: Config) -> list[Rule]:
    return [
        Rule({"record": n.JOB_FRAC_OF_STEP,
              "expr": f"{stepping_seconds(c, 'job')}\n"
                      f"  / ({n.JOB_STEP_SECONDS} > 0)\n"},
             "Fraction of step time spent in the data plane, over the processes that run\n"
             "steps: a worker's data-plane seconds outside any step (verl's workers have no\n"
             "steps) would inflate the steps' share. Ray's ops count their data time only."),
        Rule({"record": n.INSTANCE_FRAC_OF_STEP,
              "expr": over_steps(c, data_plane_seconds(c, *PROCESS))},
             "The same per process: one series per " + ", ".join(PROCESS) + "."),
        Rule({"record": n.JOB_MAX_FRAC_OF_STEP,
              "expr": f"max {c.by('job')} ({n.INSTANCE_FRAC_OF_STEP})"}),
        *_critical_path_rules(c),
        Rule({"record": n.JOB_OP_SHARE,
              "expr": f"{n.JOB_OP_SECONDS}\n  / {c.on('job')} group_left ()\n"
                      f"({n.JOB_SECONDS} > 0)\n"}),
    ]


def _critical_path_rules(c: Config) -> list[Rule]:
    """Busy and exposed wall time over step time (DESIGN.md "Time on the critical path"):
    unlike op-seconds, overlapping ops count once, and exposed is what steps waited."""
    busy, exposed = n.STEP_BUSY_SERIES, n.STEP_EXPOSED_SERIES
    return [
        Rule({"record": n.JOB_BUSY_FRAC_OF_STEP,
              "expr": f"{_rate(c, busy, 'job')}\n  / ({n.JOB_STEP_SECONDS} > 0)\n"},
             "Wall time with a data-plane op in flight while a step was open, over step time."),
        Rule({"record": n.INSTANCE_BUSY_FRAC_OF_STEP, "expr": per_process(c, busy)}),
        Rule({"record": n.JOB_EXPOSED_FRAC_OF_STEP,
              "expr": f"{_rate(c, exposed, 'job')}\n  / ({n.JOB_STEP_SECONDS} > 0)\n"},
             "Wall time steps spent blocked on the data plane, over step time: the stall a\n"
             f"prefetch hides; {n.ALERT_DOMINATES_STEP} reads this."),
        Rule({"record": n.INSTANCE_EXPOSED_FRAC_OF_STEP, "expr": per_process(c, exposed)}),
        Rule({"record": n.JOB_MAX_EXPOSED_FRAC_OF_STEP,
              "expr": f"max {c.by('job')} ({n.INSTANCE_EXPOSED_FRAC_OF_STEP})"},
             "The most stalled process (Ray Train takes the maximum across ranks likewise)."),
    ]


def _latency_rules(c: Config) -> list[Rule]:
    out = [Rule({"record": n.JOB_OP_RATE, "expr": _rate(c, f"{OP}_count", "job", "op")}),
           Rule({"record": n.JOB_OP_MEAN,
                 "expr": f"{n.JOB_OP_SECONDS}\n  / ({n.JOB_OP_RATE} > 0)\n"},
                "Of a Ray op: its data time per call (its whole duration is in its histogram).")]
    out.append(Rule(
        {"record": n.INSTANCE_OP_MEAN,
         "expr": f"{data_plane_seconds(c, *PROCESS, 'op')}\n"
                 f"  / ({_rate(c, f'{OP}_count', *PROCESS, 'op')} > 0)\n"},
        f"Mean latency per process and op: {n.ALERT_STRAGGLER} compares each process with its role.\n"
        "A Ray op's mean is its data time per call (the latency histograms keep its whole\n"
        "duration): a worker whose calls wait on a slow peer is no straggler of the data plane."))
    if c.classic_quantiles:
        out.append(Rule({"record": n.JOB_OP_LE_BUCKETS,
                         "expr": _rate(c, f"{OP}_bucket", "job", "op", "le")},
                        "Buckets add across processes because every process uses the same bounds.\n"
                        "Recorded once for the three quantiles below (it is most of their cost)."))
        out += _quantiles(c, n.JOB_OP_QUANTILE, n.JOB_OP_LE_BUCKETS,
                          "histogram_quantile is NaN without observations; `and` drops those.")
    return out if c.native_quantile_interval else out + _native_quantiles(c)


def _native_quantiles(c: Config) -> list[Rule]:
    return _quantiles(
        c, n.JOB_OP_NATIVE_QUANTILE, _rate(c, NATIVE, "job", "op"),
        "From the native histogram (one series per process and op, one schema in every process,\n"
        "so the sum keeps it): within ~1% of the truth for a smooth latency where the classic\n"
        "buckets are off by up to a third; nothing where no Prometheus has native histograms\n"
        "on. The rate is not recorded on its own: Prometheus 2.42 discards about half the\n"
        "evaluations of a recorded float-histogram rate, summed or per process (its count\n"
        "check has no tolerance for rounding), so each quantile takes the rate itself.")


def _quantiles(c: Config, record: str, source: str, why: str) -> list[Rule]:
    return [Rule({"record": record,
                  "expr": f"histogram_quantile({q}, {source})\n"
                          f"  and {c.on('job', 'op')} ({n.JOB_OP_RATE} > 0)\n",
                  "labels": {"quantile": q}}, why if i == 0 else "")
            for i, q in enumerate(n.QUANTILES)]


def _volume_rules(c: Config) -> list[Rule]:
    errors = (f"(\n  {_rate(c, n.OP_ERRORS_SERIES, 'job', 'op')}\n"
              f"    or {n.JOB_OP_RATE} * 0\n)\n"
              f"  / ({n.JOB_OP_RATE} > 0)\n")
    return [
        Rule({"record": n.JOB_OP_DIRECTION_BYTES,
              "expr": _rate(c, n.TRANSFERRED_SERIES, "job", "op", "direction")}),
        Rule({"record": n.JOB_OP_ERROR_RATIO, "expr": errors},
             "The errors counter only exists after a first error; `or ... * 0` reports 0 for ops\n"
             "that ran cleanly rather than no data."),
        Rule({"record": n.JOB_OUTSTANDING_BYTES,
              "expr": f"sum {c.by('job')} ({c.sel(n.OUTSTANDING_SIZE_SERIES)})"},
             "Occupancy of the store as this job sees it: what every process holds, summed."),
        Rule({"record": n.JOB_STAGE_CODEC_SECONDS,
              "expr": _rate(c, f"{n.CODEC_DURATION_SERIES}_sum", "job", "stage")}),
        Rule({"record": n.JOB_OVERHEAD_RATIO,
              "expr": f"{_rate(c, n.INSTR_TIME_SERIES, 'job')}\n"
                      f"  / ({n.JOB_SECONDS} > 0)\n"}),
    ]


def _guard_rules(c: Config) -> list[Rule]:
    return [
        Rule({"record": n.JOB_GUARD_CHECKED,
              "expr": counted(c, n.GUARD_CHECKED_SERIES, "job") + "\n"},
             "Wire guard. A counter is born at its first increment (value >= 1) and increase()\n"
             "needs two samples, so a series first seen in the window counts its whole value;\n"
             "otherwise a single corrupted row would never show up."),
        Rule({"record": n.JOB_GUARD_MISMATCHED,
              "expr": f"{counted(c, n.GUARD_MISMATCHED_SERIES, 'job')}\n"
                      f"  or {n.JOB_GUARD_CHECKED} * 0\n"}),
    ]


def _row_age_rules(c: Config) -> list[Rule]:
    age = n.ROW_AGE_SERIES
    rows = _rate(c, f"{age}_count", "job", "op")
    out = [Rule({"record": n.JOB_OP_ROW_AGE_MEAN,
                 "expr": f"{_rate(c, f'{age}_sum', 'job', 'op')}\n  / ({rows} > 0)\n"},
                "Row age (opt-in, rowage.py): how long the rows read had sat in the store since\n"
                "their put. Ages across nodes are as good as the nodes' clocks.")]
    for q in n.ROW_AGE_QUANTILES:
        out.append(Rule({
            "record": n.JOB_OP_ROW_AGE_QUANTILE,
            "expr": f"histogram_quantile({q}, {_rate(c, f'{age}_bucket', 'job', 'op', 'le')})\n"
                    f"  and {c.on('job', 'op')} ({rows} > 0)\n",
            "labels": {"quantile": q}}))
    return out


SYNC = n.WEIGHTS_SYNC_DURATION_SERIES
SEND, RECEIVE = (f'side="{side}"' for side in n.WEIGHT_SIDES)  # matchers


def weights_mean(c: Config, *labels: str, where: tuple[str, ...] = ()) -> str:
    """Mean seconds per weight sync grouped by `labels` (the records group by job and side;
    the slowest receiver and `dpobs top` by the process)."""
    return (f"{_rate(c, f'{SYNC}_sum', *labels, where=where)}\n"
            f"  / ({_rate(c, f'{SYNC}_count', *labels, where=where)} > 0)\n")


def weights_bandwidth(c: Config, *labels: str) -> str:
    """Bytes moved per second of syncing (not per second of wall time): the link's speed."""
    return (f"{_rate(c, n.WEIGHTS_TRANSFERRED_SERIES, *labels)}\n"
            f"  / ({_rate(c, f'{SYNC}_sum', *labels)} > 0)\n")


def _weight_rules(c: Config) -> list[Rule]:
    slowest = weights_mean(c, *PROCESS, where=(RECEIVE,)).replace("\n", "\n  ").rstrip()
    synced = c.sel(n.STEP_WEIGHT_SYNC_SERIES)
    steps = f"rate({c.sel(f'{STEP}_sum')}[5m]) and {c.on(*PROCESS)} {synced}"
    return [
        Rule({"record": n.JOB_SIDE_WEIGHTS_SYNC_MEAN, "expr": weights_mean(c, "job", "side")},
             "Weight sync (tel.weights): one observation per completed sync, side and process."),
        Rule({"record": n.JOB_SIDE_WEIGHTS_BANDWIDTH,
              "expr": weights_bandwidth(c, "job", "side")}),
        Rule({"record": n.JOB_WEIGHTS_SYNC_MAX_MEAN,
              "expr": f"max {c.by('job')} (\n  {slowest}\n)\n"},
             "The slowest receiver's mean: every receiver must finish before rollouts resume."),
        Rule({"record": n.JOB_WEIGHT_SYNC_FRAC_OF_STEP,
              "expr": f"{_rate(c, n.STEP_WEIGHT_SYNC_SERIES, 'job')}\n"
                      f"  / (sum {c.by('job')} ({steps}) > 0)\n"},
             "Over the step time of the processes that record weight-sync step seconds only\n"
             "(the series exists from a process's first sync inside a step: the trainer's\n"
             "refit). Rollout workers receive outside their steps, or have none; their step\n"
             "time would dilute the share the trainer pays (a 40% refit read as 5% beside\n"
             f"seven times as many rollout processes). {n.ALERT_WEIGHT_SYNC_SLOW} reads this."),
    ]


def _agent_rules(c: Config) -> list[Rule]:
    up = c.sel("up", 'node!=""')
    return [Rule(
        {"record": n.NODE_AGENT_LAST_SAMPLE, "expr": f"max {c.by('node')} (timestamp({up}))"},
        "Cluster: when each node's agent last delivered a sample (every series an agent sends\n"
        "carries `node`, its own `up` included). A killed agent writes no staleness markers,\n"
        "so its series stay visible for 5m; their sample timestamps tell the truth, and\n"
        f"{n.ALERT_AGENT_DOWN} reads this over a longer window than the lookback.")]


def recording_groups(c: Config) -> list[Group]:
    rules = (_time_rules(c) + _frac_rules(c) + _latency_rules(c) + _volume_rules(c)
             + _guard_rules(c) + _row_age_rules(c) + _weight_rules(c) + store_rules(c)
             + ray_rules(c) + _agent_rules(c))
    groups = [Group("dpobs-recording", rules)]
    if c.native_quantile_interval:
        # Another group runs beside the first; its `and` reads the last recorded op rate.
        groups.append(Group("dpobs-native-quantiles", _native_quantiles(c),
                            c.native_quantile_interval))
    return groups


HEADER = """\
Recording rules for dpobs-otel, generated by `dpobs mixin` from dpobs_otel/mixin/rules.py
(do not edit: change the generator or its Config). Names follow level:metric:operations and
are pinned in DESIGN.md; dashboards and alerts read these, not the raw series.

""" + (__doc__ or "").split("\n", 2)[2]


def recording_file(c: Config) -> str:
    return rule_file(HEADER, recording_groups(c))
