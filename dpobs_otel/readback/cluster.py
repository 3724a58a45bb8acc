"""The cluster view in the driver's logger: tel.cluster_step_metrics(source).

    view = ClusterView("/path/to/sd_dir")            # or "http://prometheus:9090"
    logger.log(view.step_metrics())                  # dict under dpobs/cluster/
    columns, rows = view.breakdown()                 # the same window per op, worst first

Each call reads every process's cumulative counters (sources.py: at the call, from the
file_sd directory's endpoints; or the latest raw samples in Prometheus) and differences them
against the previous call's, process by process (`delta`). The keys mirror
tel.step_metrics() (stepmetrics.py) under `dpobs/cluster/`: step_s, steps, data_plane_s
(every process's op seconds and Ray data seconds), frac_of_step (the data-plane seconds of
the processes that step over their step time; absent without a completed step), ray/<op>/
{seconds, calls, errors, mb, data_s, share}, busy_s and exposed_s (the
processes' busy and exposed counters, summed) with busy_frac and exposed_frac (the sums over
step time, absent like frac_of_step) and exposed_frac_max (the most stalled process), op/<op>/{seconds, calls,
errors, mb, share}, codec/<stage>_s, instrumentation_s and _frac, outstanding_mb (the
gauges now, summed), guard/... (present when any summed process exports guard series,
absent otherwise), row_age/rows and row_age/mean_s (the rows the processes aged in the
window and their mean age; absent when none), plus
frac_of_step_max (the highest one process's fraction), processes,
processes_unreachable, processes_restarted, processes_lost, scrape_s (what the call cost),
and staleness_s for a Prometheus source (how old the oldest process's newest sample is). No
per-op maximum: a maximum cannot be differenced from counters. A file_sd source also reads
each endpoint's native op-duration histograms (from the same protobuf answer as its counters:
one request per endpoint) and differences them the same way, per process, for the breakdown's p50/p90/p99 columns.

Which process counts what (a process is (job, node, instance, role, rank); scrape.Target):
- alive and reachable at both calls: its counters' change. Exact at the step boundary for a
  file_sd source, since both reads happen at the calls.
- restarted between the calls (the file_sd name's start ticks or target_info's
  service.instance.id changed, or a counter went back): what it did since its restart, in
  `processes` and `processes_restarted`. What its previous incarnation did after the
  previous call is gone with it.
- not listed at the previous call: everything since its start (its file is written before
  its first measured op, so at the previous call it had done nothing; a Prometheus source
  counts its first samples in full the same way).
- listed but unanswered (refused, timed out, Prometheus's up == 0): `processes_unreachable`,
  left out; when it answers again it starts a new baseline, and that call counts it nowhere.
- reachable at the previous call and gone now (file removed, or its writer dead: the file's
  lock is free; or no longer in Prometheus): `processes_lost`. Its partial window, from the
  previous call to its death, is left out: nothing can read a dead process's counters.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields, replace

from . import native, scrape, weights
from .native import NativeHistogram
from .scrape import OpTotals, ProcessTotals
from .sources import Seen, source_for

MB = 1e6
PREFIX = "dpobs/cluster/"
COLUMNS = ("op", "calls", "mean_ms", "max_ms", "mb", "share", "slowest_role", "slowest_rank",
           "slowest_mean_ms", "p50_ms", "p90_ms", "p99_ms")
QUANTILES = (0.5, 0.9, 0.99)  # the last three columns
_P99 = COLUMNS.index("p99_ms")


def _sub(a: dict, b: dict) -> dict:
    return {k: v - b.get(k, 0.0) for k, v in a.items()}


def delta(prev: ProcessTotals | None, now: ProcessTotals) -> ProcessTotals:
    """now - prev, counter by counter (buckets per bound); prev None means since start.
    Gauges (outstanding), instance_id and timestamp are now's. Assumes now follows prev
    (check now.went_back(prev) first)."""
    if prev is None:
        return now
    guard = None if now.guard is None else _sub(now.guard, prev.guard or {})
    return replace(now, ops=_ops_delta(prev.ops, now.ops),
                   ray_ops=_ops_delta(prev.ray_ops, now.ray_ops),
                   ray_data=_sub(now.ray_data, prev.ray_data), steps=now.steps - prev.steps,
                   row_age_seconds=now.row_age_seconds - prev.row_age_seconds,
                   row_age_rows=now.row_age_rows - prev.row_age_rows,
                   step_seconds=now.step_seconds - prev.step_seconds,
                   busy_seconds=now.busy_seconds - prev.busy_seconds,
                   exposed_seconds=now.exposed_seconds - prev.exposed_seconds,
                   codec_seconds=_sub(now.codec_seconds, prev.codec_seconds),
                   instrumentation_seconds=_sub(now.instrumentation_seconds,
                                                prev.instrumentation_seconds),
                   instrumentation_errors=_sub(now.instrumentation_errors,
                                               prev.instrumentation_errors),
                   guard=guard, weights=weights.window(prev.weights, now.weights))


def _ops_delta(prev: dict, now: dict) -> dict:
    out = {}
    for op, o in now.items():
        p = prev.get(op, OpTotals())
        kw = {f.name: getattr(o, f.name) - getattr(p, f.name) for f in fields(OpTotals)
              if f.name != "buckets"}
        out[op] = OpTotals(**kw, buckets=_sub(o.buckets, p.buckets))
    return out


def tls_context_for(settings):
    """The client side of a process's own TLS settings (DPOBS_TLS_*): processes of one job
    serve alike, so a driver serving TLS scrapes over https, presenting its certificate and
    checking theirs against tls_client_cafile (the job's CA). None without TLS."""
    if settings is None or not settings.tls_certfile:
        return None
    return scrape.tls_context(settings.tls_client_cafile, settings.tls_certfile,
                              settings.tls_keyfile)


@dataclass
class Window:
    """What one call found: each summed process's labels and delta, and the counts."""
    deltas: dict[tuple, tuple[dict[str, str], ProcessTotals]]
    unreachable: int = 0
    restarted: int = 0
    lost: int = 0
    outstanding_bytes: float = 0.0
    scrape_s: float = 0.0
    staleness_s: float | None = None
    # key -> op -> the native op-duration histogram's window; a summed process missing here
    # (Prometheus source, a text answer now or at the previous call) has none
    native: dict[tuple, dict[str, NativeHistogram]] = field(default_factory=dict)


class ClusterView:
    """The differencing state of one source across calls (see the module docstring)."""

    def __init__(self, source, job: str | None = None, timeout: float = 1.0,
                 ssl_context=None):
        self.source = source_for(source, job, timeout, ssl_context)
        self._base: dict[tuple, tuple[str | None, ProcessTotals]] = {}
        self._nbase: dict[tuple, dict[str, NativeHistogram] | None] = {}
        self._listed: set[tuple] | None = None  # None: no call yet
        self.last: Window | None = None

    def advance(self) -> Window:
        """Read the source, difference against the previous call, keep this as the base."""
        t0 = time.perf_counter()
        reading = self.source.read()
        w = Window({}, staleness_s=reading.staleness_s)
        base, self._base = self._base, {}
        nbase, self._nbase = self._nbase, {}
        for key, seen in reading.processes.items():
            if seen.totals is None:
                w.unreachable += 1
                continue
            d = self._window(key, seen, base.get(key), w)
            self._base[key] = (seen.incarnation, seen.totals)
            self._nbase[key] = seen.native
            w.outstanding_bytes += seen.totals.outstanding_bytes
            if d is not None:
                w.deltas[key] = (seen.labels, d)
                since_start = d is seen.totals  # new, or restarted: counted from its start
                h = native_window(None if since_start else nbase.get(key), seen.native,
                                  since_start)
                if h is not None:
                    w.native[key] = h
        w.lost = sum(1 for k in base if k not in reading.processes or k in reading.lost)
        self._listed = set(reading.processes)
        w.scrape_s = time.perf_counter() - t0
        self.last = w
        return w

    def _window(self, key, seen: Seen, prev, w: Window) -> ProcessTotals | None:
        if prev is None:
            if self._listed is None or key not in self._listed:
                return seen.totals  # first call, or new since the previous one: since start
            return None  # unanswered last time: its earlier counts fit no window
        inc, totals = prev
        if (inc and seen.incarnation and inc != seen.incarnation) or seen.totals.went_back(totals):
            w.restarted += 1
            return seen.totals
        return delta(totals, seen.totals)

    def step_metrics(self) -> dict[str, float]:
        return metrics(self.advance())

    def breakdown(self) -> tuple[list[str], list[list]]:
        """(columns, rows) of the last call's window: see `breakdown`."""
        return breakdown(self.last) if self.last is not None else (list(COLUMNS), [])


def native_window(prev: dict | None, now: dict | None, since_start: bool) -> dict | None:
    """One process's native op-duration histograms over the window, op by op: now - prev,
    or now in full when the process is counted from its start (new, or restarted: also
    when a histogram went back, or lost an op, though the counters did not tell). None when
    unknown: not read now, or not read at the previous call (no baseline)."""
    if now is None or since_start:
        return now
    if prev is None:
        return None
    out = {}
    for op, h in now.items():
        out[op] = native.subtract(h, prev.get(op))
        if out[op] is None:
            return now
    return now if set(prev) - set(now) else out


def metrics(w: Window) -> dict[str, float]:
    """The cluster dict of one window (keys in the module docstring)."""
    p = PREFIX
    procs = [d for _, d in w.deltas.values()]
    step_s = sum(d.step_seconds for d in procs)
    ops: dict[str, list[float]] = {}  # op -> [seconds, calls, errors, bytes]
    for d in procs:
        for op, o in d.ops.items():
            acc = ops.setdefault(op, [0.0, 0.0, 0.0, 0.0])
            for i, v in enumerate((o.seconds, o.calls, o.errors, o.bytes)):
                acc[i] += v
    dp = sum(v[0] for v in ops.values()) + sum(sum(d.ray_data.values()) for d in procs)
    out = {p + "step_s": step_s, p + "steps": sum(d.steps for d in procs),
           p + "data_plane_s": dp}
    # A fraction of step over the processes that step: a worker without steps (verl's, on
    # any plane) adds to the per-op accounts, never to the numerator (DESIGN.md)
    stepping = [d for d in procs if d.step_seconds > 0]
    if step_s > 0:
        out[p + "frac_of_step"] = sum(map(_data_plane_s, stepping)) / step_s
    fracs = [_data_plane_s(d) / d.step_seconds for d in stepping]
    if fracs:
        out[p + "frac_of_step_max"] = max(fracs)
    out.update(_critical_path(procs, step_s))
    for op in sorted(ops):
        seconds, calls, errors, nbytes = ops[op]
        q = f"{p}op/{op}/"
        out.update({q + "seconds": seconds, q + "calls": calls, q + "errors": errors,
                    q + "share": seconds / dp if dp > 0 else 0.0, q + "mb": nbytes / MB})
    _ray_into(out, p, procs)
    _sum_into(out, p + "codec/", "_s", [d.codec_seconds for d in procs])
    guards = [d.guard for d in procs if d.guard is not None]
    if guards:
        _sum_into(out, p + "guard/", "", guards)
    _row_age_into(out, p, procs)
    out[p + "outstanding_mb"] = w.outstanding_bytes / MB
    instr = sum(sum(d.instrumentation_seconds.values()) for d in procs)
    out[p + "instrumentation_s"] = instr
    out[p + "instrumentation_frac"] = instr / dp if dp > 0 else 0.0
    out.update({p + "processes": len(procs), p + "processes_unreachable": w.unreachable,
                p + "processes_restarted": w.restarted, p + "processes_lost": w.lost,
                p + "scrape_s": w.scrape_s})
    if w.staleness_s is not None:
        out[p + "staleness_s"] = w.staleness_s
    return out


def _data_plane_s(d: ProcessTotals) -> float:
    """A process's data-plane seconds: its ops' and its Ray ops' data time."""
    return sum(o.seconds for o in d.ops.values()) + sum(d.ray_data.values())


def _ray_into(out: dict, p: str, procs: list[ProcessTotals]) -> None:
    """ray/<op>/{seconds,calls,errors,mb}: Ray's ops, whole; ray/<op>/{data_s,share}: their
    data time and its share of the data plane's (as tel.step_metrics() says them)."""
    for d in procs:
        for op, o in d.ray_ops.items():
            q = f"{p}ray/{op}/"
            for key, v in (("seconds", o.seconds), ("calls", o.calls), ("errors", o.errors),
                           ("mb", o.bytes / MB), ("data_s", d.ray_data.get(op, 0.0))):
                out[q + key] = out.get(q + key, 0.0) + v
    dp = out[p + "data_plane_s"]
    for key in [k for k in out if k.startswith(p + "ray/") and k.endswith("/data_s")]:
        out[key[:-len("data_s")] + "share"] = out[key] / dp if dp > 0 else 0.0


def _row_age_into(out: dict, p: str, procs: list[ProcessTotals]) -> None:
    """row_age/rows and row_age/mean_s, when the processes aged rows in the window (the
    counters cannot tell row age off from no read). No maximum: it cannot be differenced."""
    rows = sum(d.row_age_rows for d in procs)
    if rows > 0:
        out[p + "row_age/rows"] = rows
        out[p + "row_age/mean_s"] = sum(d.row_age_seconds for d in procs) / rows


def _critical_path(procs: list[ProcessTotals], step_s: float) -> dict[str, float]:
    """busy_s, exposed_s (summed over processes) and, with a completed step, busy_frac and
    exposed_frac (the sums over step time) and exposed_frac_max (the most stalled process)."""
    p = PREFIX
    busy = sum(d.busy_seconds for d in procs)
    exposed = sum(d.exposed_seconds for d in procs)
    out = {p + "busy_s": busy, p + "exposed_s": exposed}
    if step_s > 0:
        out[p + "busy_frac"] = busy / step_s
        out[p + "exposed_frac"] = exposed / step_s
        out[p + "exposed_frac_max"] = max(d.exposed_seconds / d.step_seconds
                                          for d in procs if d.step_seconds > 0)
    return out


def _sum_into(out: dict, prefix: str, suffix: str, dicts: list[dict]) -> None:
    acc: dict[str, float] = {}
    for d in dicts:
        for k, v in d.items():
            acc[k] = acc.get(k, 0.0) + v
    for k in sorted(acc):
        out[f"{prefix}{k}{suffix}"] = acc[k]


def max_bound(buckets: dict[float, float]) -> float | None:
    """The upper bound of the highest bucket that gained a call in the window (cumulative
    buckets: the lowest bound whose count is the total): the slowest call took at most this
    long, and longer than the next bound down. None without calls, or when that is the
    +Inf bucket (slower than the last finite bound)."""
    if not buckets:
        return None
    total = max(buckets.values())
    if total <= 0:
        return None
    top = min(b for b, n in buckets.items() if n >= total)
    return None if math.isinf(top) else top


def breakdown(w: Window) -> tuple[list[str], list[list]]:
    """Per op over the window, worst (most data-plane seconds) first: columns COLUMNS.

    mean_ms is seconds / calls summed over processes. max_ms is not a measured maximum (a
    maximum cannot be differenced from counters): it is `max_bound` of the latency
    histogram summed over processes, so the slowest call took at most max_ms and longer
    than the bucket bound below it; None when no call or slower than 30 s. slowest_*: the
    process with the highest mean latency for that op in the window (its role, rank and
    mean). p50_ms, p90_ms, p99_ms: quantiles of the window's calls over all processes, from
    their native histograms (schema 4: buckets 4.4% wide), each differenced against the
    previous call's like the counters and merged (`quantiles`); None when the op had no
    call in the window, or when any process with calls of it has no native window: a
    Prometheus URL source (the view reads float samples only), or an endpoint that answered
    in text (no protobuf exposition) now or at the previous call.
    Rows are plain lists (wandb.Table(columns=..., data=rows))."""
    agg: dict[str, list] = {}  # op -> [seconds, calls, bytes, buckets, (mean, labels)]
    for labels, d in w.deltas.values():
        for op, o in d.ops.items():
            a = agg.setdefault(op, [0.0, 0.0, 0.0, {}, None])
            a[0] += o.seconds
            a[1] += o.calls
            a[2] += o.bytes
            for le, n in o.buckets.items():
                a[3][le] = a[3].get(le, 0.0) + n
            if o.calls > 0 and (a[4] is None or o.seconds / o.calls > a[4][0]):
                a[4] = (o.seconds / o.calls, labels)
    dp = sum(a[0] for a in agg.values())
    rows = []
    for op, (seconds, calls, nbytes, buckets, slow) in sorted(
            agg.items(), key=lambda kv: (-kv[1][0], kv[0])):
        top = max_bound(buckets)
        rows.append([op, int(calls), 1e3 * seconds / calls if calls else None,
                     None if top is None else 1e3 * top, nbytes / MB,
                     seconds / dp if dp > 0 else 0.0,
                     slow[1]["role"] if slow else None, slow[1]["rank"] if slow else None,
                     1e3 * slow[0] if slow else None] + quantiles(w, op))
    return list(COLUMNS), rows


def quantiles(w: Window, op: str) -> list[float | None]:
    """[p50_ms, p90_ms, p99_ms] of one op over the window: the summed processes' native
    windows merged (native.merge) and interpolated as histogram_quantile() does. Nones when
    no call, or when a process that made calls of it has no native window for it."""
    hists = []
    for key, (_, d) in w.deltas.items():
        o = d.ops.get(op)
        h = w.native.get(key, {}).get(op)
        if h is None:
            if o is not None and o.calls > 0:
                return [None] * len(QUANTILES)  # some of the window's calls unseen
            continue
        hists.append(h)
    pooled = native.merge(hists)
    if pooled is None or pooled.count <= 0:
        return [None] * len(QUANTILES)
    return [1e3 * pooled.quantile(q) for q in QUANTILES]


def text(got: dict, table: tuple[list[str], list[list]]) -> str:
    """A cluster dict and its breakdown as a few lines for a terminal or a log."""
    keys = ("processes", "steps", "frac_of_step", "frac_of_step_max", "busy_frac",
            "exposed_frac", "exposed_frac_max", "data_plane_s",
            "processes_restarted", "processes_unreachable", "processes_lost", "scrape_s",
            "staleness_s")
    out = ["  " + "  ".join(f"{k}={got[PREFIX + k]:.4g}" for k in keys if PREFIX + k in got)]
    columns, rows = table
    # op .. share, then p99_ms (when the breakdown has it)
    p99 = slice(_P99, _P99 + 1)
    out.append("  " + "".join(f"{c:>10}" for c in columns[:6] + columns[p99])
               + "  slowest (role rank)")
    for r in rows:
        cells = "".join(f"{'-' if v is None else format(v, '.4g'):>10}"
                        for v in r[1:6] + r[p99])
        out.append(f"  {r[0]:>10}{cells}  {r[6] or '-'} {r[7] or ''}")
    return "\n".join(out)
