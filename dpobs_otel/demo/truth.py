"""The workload's own ground truth, measured beside dpobs and compared with it: time inside
every data-plane call a process makes (Timed), per-op latency samples (Durations) and the
payload bytes moved (Truth)."""
from __future__ import annotations

import random
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

    def __getattr__(self, name):
        fn = getattr(self._inner, name)
        op = OPS.get(name)
        if op not in self._ops:
            return fn
        record = self.durations.setdefault(op, Durations()).add

        def timed(*args, **kwargs):
            t = perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                record(perf_counter() - t)
        return timed


class Truth:
    """What one process did, as it measured it."""

    def __init__(self, timed: Timed):
        self.timed = timed
        self.steps = 0
        self.step_s = 0.0
        self.bytes: dict[tuple[str, str], int] = {}

    def moved(self, op: str, direction: str, nbytes: int) -> None:
        key = (op, direction)
        self.bytes[key] = self.bytes.get(key, 0) + nbytes

    def take(self) -> dict:
        """This period's truth, and start the next one."""
        out = {"steps": self.steps, "step_s": self.step_s, "bytes": self.bytes,
               "ops": self.timed.durations}
        self.steps, self.step_s, self.bytes, self.timed.durations = 0, 0.0, {}, {}
        return out


# -- the processes -----------------------------------------------------------------------
