"""The answers without a Prometheus: scrape every endpoint a file_sd directory lists
(dpobs_otel.readback.scrape), keep each process's snapshots for a window, and compute what the
recording rules compute from the oldest and newest snapshot in it:

- rates are the difference of two snapshots over the time between them (rate() without
  its extrapolation to the window's edges, which cancels in every ratio shown);
- ratios sum numerators and denominators over processes, then divide (as the rules do);
- quantiles are histogram_quantile over the summed bucket differences (buckets.quantile);
- the guard's counts are increases over the window, and a process first seen after top's
  first scrape counts its whole value (the rules count a series born in the window in
  full: otherwise a single corrupted row in a short-lived process would never show);
- a restarted process (scrape's went_back) starts a new history, as rate() absorbs resets.

An endpoint that does not answer is a process shown DOWN with the reason; it never stops
the view. A process whose file has gone from the directory is forgotten."""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass

from ..readback import buckets, cluster, scrape, verdict
from ..readback.weights import WeightTotals, checks_whole
from . import weights
from .model import Answers, Job, Op, Process, stragglers, worst_first


@dataclass
class Rates:
    """One process over the window: per-second rates and the span they cover."""
    span_s: float
    dp_s: float  # data-plane seconds per second, all ops
    step_s: float  # step seconds per second
    busy_s: float  # busy data-plane seconds per second (DESIGN.md "Time on the critical path")
    exposed_s: float  # exposed data-plane seconds per second
    calls: dict  # op -> calls/s
    seconds: dict  # op -> data-plane seconds/s
    buckets: dict  # op -> {le: observations/s}
    read: float  # bytes/s
    write: float
    checked: float  # guard rows over the window (an increase, not a rate)
    mismatched: float
    queue: dict  # the verdict's counts over the window (readback/verdict.py)
    weights: WeightTotals | None  # the window's weight syncs (readback/weights.py)


def difference(old: scrape.ProcessTotals | None, new: scrape.ProcessTotals,
               span_s: float) -> Rates:
    """Rates from `old` to `new` (cluster.delta per counter, over span_s); old None means
    from zero (counters born in the window)."""
    d = cluster.delta(old, new)
    per = 1.0 / span_s if span_s > 0 else 0.0
    guard = d.guard or {}
    # A Ray op's data time is its data-plane seconds (never its wait for a producer)
    seconds = {**{op: o.seconds for op, o in d.ops.items()}, **d.ray_data}
    calls = {**{op: o.calls for op, o in d.ops.items()},
             **{op: d.ray_ops[op].calls for op in d.ray_data if op in d.ray_ops}}
    return Rates(span_s, sum(seconds.values()) * per, d.step_seconds * per,
                 d.busy_seconds * per, d.exposed_seconds * per,
                 {op: c * per for op, c in calls.items()},
                 {op: v * per for op, v in seconds.items()},
                 {op: {le: c * per for le, c in o.buckets.items()} for op, o in d.ops.items()},
                 sum(o.read_bytes for o in d.ops.values()) * per,
                 sum(o.write_bytes for o in d.ops.values()) * per,
                 guard.get("rows_checked", 0.0), guard.get("rows_mismatched", 0.0),
                 verdict.counts_of(d), d.weights)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


class DirectSource:
    needs_two_scrapes = True  # a rate needs two snapshots: --once waits for a second

    def __init__(self, sd_dir: str, window_s: float = 300.0, timeout: float = 2.0,
                 ssl_context=None):
        self.sd_dir, self.window_s, self.timeout = sd_dir, window_s, timeout
        self.ssl_context = ssl_context
        self.history: dict[tuple, deque] = {}  # process -> deque of ProcessTotals
        # process -> its first snapshot, for processes first seen after our first scrape
        self.born: dict[tuple, scrape.ProcessTotals] = {}
        self.first_scrape: float | None = None

    def describe(self) -> str:
        return f"file_sd {self.sd_dir} (scraped directly, {self.window_s:g}s window)"

    def answers(self) -> Answers:
        listed = scrape.targets(self.sd_dir)
        got = scrape.scrape_all(listed, timeout=self.timeout, ssl_context=self.ssl_context)
        now = time.time()
        procs, rates = [], {}
        for target, res in got.items():
            p = Process(job=target.label("job"), instance=target.address,
                        role=target.label("role"), rank=target.label("rank"),
                        node=target.label("node"))
            procs.append(p)
            if isinstance(res, Exception):
                p.up, p.error = False, _reason(res)
                continue
            r = self._record(target.process, res)
            if r is not None:
                rates[target.process] = (p, r)
                p.frac_of_step = _ratio(r.dp_s, r.step_s)
                p.busy_frac, p.exposed_frac = _ratio(r.busy_s, r.step_s), _ratio(
                    r.exposed_s, r.step_s)
        for gone in set(self.history) - {t.process for t in listed}:
            del self.history[gone]
            self.born.pop(gone, None)
        if self.first_scrape is None:
            self.first_scrape = now
        spans = [r.span_s for _, r in rates.values()]
        jobs = self._jobs(sorted({p.job for p in procs}), rates, got)
        lines = [line for p, r in rates.values()
                 for line in weights.from_window(p, r.weights, r.step_s * r.span_s)]
        return Answers(self.describe(), max(spans) if spans else None, now,
                       worst_first(procs), jobs, alerts=None, stragglers=_stragglers(rates),
                       weights=weights.judged(lines))

    def _record(self, key: tuple, totals: scrape.ProcessTotals) -> Rates | None:
        h = self.history.get(key)
        if h and totals.went_back(h[-1]):
            h = None  # restarted: its counters begin again
        if h is None:
            h = self.history[key] = deque()
            if self.first_scrape is not None:
                self.born[key] = totals
        h.append(totals)
        # Keep the newest snapshot at or before the window's start (by the scrapes' own
        # timestamps, so each process's span is its own).
        while len(h) > 2 and h[1].timestamp <= totals.timestamp - self.window_s:
            h.popleft()
        if len(h) < 2:
            return None
        r = difference(h[0], h[-1], h[-1].timestamp - h[0].timestamp)
        if self.born.get(key) is h[0]:
            whole = difference(None, h[-1], 1.0)  # born here: all its checks count
            r.checked, r.mismatched = whole.checked, whole.mismatched
            r.weights = checks_whole(r.weights, whole.weights)
        return r

    def _jobs(self, names: list[str], rates: dict, got: dict) -> list[Job]:
        jobs = []
        for name in names:
            rs = [r for p, r in rates.values() if p.job == name]
            mine = [p for p, _ in rates.values() if p.job == name]
            fracs = [p.frac_of_step for p in mine if p.frac_of_step is not None]
            exposed = [p.exposed_frac for p in mine if p.exposed_frac is not None]
            up = [t for t, res in got.items()
                  if t.label("job") == name and not isinstance(res, Exception)]
            # over the processes that step: a worker without steps is never in a numerator
            j = Job(job=name, frac_of_step=_ratio(sum(r.dp_s for r in rs if r.step_s > 0),
                                                  sum(r.step_s for r in rs)),
                    max_frac_of_step=max(fracs) if fracs else None,
                    busy_frac=_ratio(sum(r.busy_s for r in rs), sum(r.step_s for r in rs)),
                    exposed_frac=_ratio(sum(r.exposed_s for r in rs),
                                        sum(r.step_s for r in rs)),
                    max_exposed_frac=max(exposed) if exposed else None,
                    outstanding_bytes=sum(got[t].outstanding_bytes for t in up) if up else None)
            if rs:
                j.read_bytes_per_s = sum(r.read for r in rs)
                j.write_bytes_per_s = sum(r.write for r in rs)
                j.guard_checked = sum(r.checked for r in rs)
                j.guard_mismatched = sum(r.mismatched for r in rs)
                j.ops = _ops(rs)
                j.queue = verdict.verdict(verdict.from_processes(
                    [(p.role, r.queue) for p, r in rates.values() if p.job == name]))
            jobs.append(j)
        return jobs


def _stragglers(rates: dict) -> list:
    """Each process's mean latency per op over its window (as the per-process rule), then
    the alert's test."""
    means = []
    for p, r in rates.values():
        labels = {"job": p.job, "role": p.role, "rank": p.rank, "node": p.node,
                  "instance": p.instance}
        means += [(dict(labels, op=op), r.seconds[op] / calls)
                  for op, calls in r.calls.items() if calls > 0]
    return stragglers(means)


def _ops(rs: list[Rates]) -> list[Op]:
    total = sum(r.dp_s for r in rs)
    out = []
    for op in sorted({op for r in rs for op in r.calls}):
        calls = sum(r.calls.get(op, 0.0) for r in rs)
        secs = sum(r.seconds.get(op, 0.0) for r in rs)
        le_counts: dict[float, float] = {}
        for r in rs:
            for le, c in r.buckets.get(op, {}).items():
                le_counts[le] = le_counts.get(le, 0.0) + c
        o = Op(op=op, share=_ratio(secs, total), ops_per_s=calls)
        if calls > 0:  # the rules drop latency answers for ops without calls in the window
            o.mean_s = secs / calls
            o.p90_s, o.p99_s = (_finite(buckets.quantile(le_counts, q)) for q in (0.9, 0.99))
            o.quantiles = "classic"  # the text scrape's buckets
        out.append(o)
    return sorted(out, key=lambda o: (-(o.share or 0.0), o.op))


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ConnectionRefusedError):
        text = "connection refused"
    elif isinstance(exc, TimeoutError):
        text = "timed out"
    return text[:60]
