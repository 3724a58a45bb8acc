"""The workload's own ground truth, measured beside dpobs and compared with it: time inside
every data-plane call a process makes (Timed), per-op latency samples (Durations), the
payload bytes moved, and time on the critical path from the intervals of calls, steps and
waits (Truth): plain interval arithmetic, sharing nothing with dpobs's critical.py."""
from __future__ import annotations

import contextlib
import random
import threading
from time import perf_counter

from ..names import OPS


class Durations:
    """Every call's count and total, and a uniform sample of at most CAP of them for the
    quantiles, so a run until stopped (--duration 0) does not grow without bound."""
    CAP = 100_000

    def __init__(self):
        self.n, self.total, self.kept = 0, 0.0, []
        self._rng = random.Random(0)

    def __len__(self) -> int:
        return self.n

    def add(self, seconds: float) -> None:
        self.n += 1
        self.total += seconds
        if len(self.kept) < self.CAP:
            self.kept.append(seconds)
        else:  # reservoir sampling: every call so far kept with equal probability
            i = self._rng.randrange(self.n)
            if i < self.CAP:
                self.kept[i] = seconds

    def merge(self, other: "Durations") -> None:
        self.n += other.n
        self.total += other.total
        self.kept += other.kept  # a report's merge: bounded by the processes' caps


class Timed:
    """The raw store client, timing the calls the workload itself makes: the ground truth of
    data-plane time. Ops outside `ops` (dpobs's own occupancy reconciliation) pass untimed."""

    def __init__(self, inner, ops: set[str]):
        self._inner = inner
        self._ops = ops
        self.durations: dict[str, Durations] = {}
        self.calls: list[tuple[float, float, int]] = []  # (start, end, thread) of each call

    def __getattr__(self, name):
        fn = getattr(self._inner, name)
        op = OPS.get(name)
        if op not in self._ops:
            return fn
        record = self.durations.setdefault(op, Durations()).add
        calls = self.calls

        def timed(*args, **kwargs):
            t = perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = perf_counter()
                record(t1 - t)
                calls.append((t, t1, threading.get_ident()))
        return timed


class Truth:
    """What one process did, as it measured it."""

    def __init__(self, timed: Timed):
        self.timed = timed
        self.thread = threading.get_ident()  # the step thread
        self.steps = 0
        self.step_s = 0.0
        self.bytes: dict[tuple[str, str], int] = {}
        self.step_spans: list[tuple[float, float]] = []
        self.waits: list[tuple[float, float]] = []  # the step thread waiting for a prefetch
        self.extra: dict = {}  # what a mode adds to the truth (asynchronous.py: row_age)

    def moved(self, op: str, direction: str, nbytes: int) -> None:
        key = (op, direction)
        self.bytes[key] = self.bytes.get(key, 0) + nbytes

    def step(self, t0: float, t1: float) -> None:
        self.steps += 1
        self.step_s += t1 - t0
        self.step_spans.append((t0, t1))

    @contextlib.contextmanager
    def waiting(self):
        t0 = perf_counter()
        try:
            yield
        finally:
            self.waits.append((t0, perf_counter()))

    def take(self) -> dict:
        """This period's truth, and start the next one. A call still in flight now (a
        prefetch) lands in the next period, where only its part inside that period's steps
        counts: a fraction of one call per period, left out."""
        calls, self.timed.calls = self.timed.calls, []
        steps = union(self.step_spans)
        mine = [(a, b) for a, b, tid in calls if tid == self.thread]
        out = {"steps": self.steps, "step_s": self.step_s, "bytes": self.bytes,
               "ops": self.timed.durations,
               "busy_s": length(intersect(union((a, b) for a, b, _ in calls), steps)),
               "exposed_s": length(intersect(union(mine + self.waits), steps)), **self.extra}
        self.extra = {}
        self.steps, self.step_s, self.bytes, self.timed.durations = 0, 0.0, {}, {}
        self.step_spans, self.waits = [], []
        return out


# -- intervals (start, end) ---------------------------------------------------------------
def union(intervals) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same time."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def intersect(xs, ys) -> list[tuple[float, float]]:
    """The time in both of two unions (sorted, disjoint): one linear pass."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if hi > lo:
            out.append((lo, hi))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def length(intervals) -> float:
    return sum(b - a for a, b in intervals)


# -- arithmetic over truths (the report, compare and the tests) ----------------------------
def merge(truths) -> dict:
    out = {"steps": 0, "step_s": 0.0, "busy_s": 0.0, "exposed_s": 0.0, "bytes": {}, "ops": {}}
    for t in truths:
        for k in ("steps", "step_s", "busy_s", "exposed_s"):
            out[k] += t[k]
        for k, v in t["bytes"].items():
            out["bytes"][k] = out["bytes"].get(k, 0) + v
        for op, d in t["ops"].items():
            out["ops"].setdefault(op, Durations()).merge(d)
    return out


def dp_seconds(t: dict) -> float:
    return sum(d.total for d in t["ops"].values())


def frac_of_step(t: dict) -> float:
    return dp_seconds(t) / t["step_s"] if t["step_s"] else 0.0


def op_shares(t: dict) -> dict[str, float]:
    total = dp_seconds(t)
    return {op: d.total / total for op, d in t["ops"].items()} if total else {}


def quantile(values, q: float) -> float:
    """Linear interpolation between closest ranks (of a Durations' sample, or a list)."""
    v = sorted(getattr(values, "kept", values))
    if not v:
        return float("nan")
    x = q * (len(v) - 1)
    lo = int(x)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (x - lo)
