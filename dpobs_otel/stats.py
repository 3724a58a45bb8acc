"""Cumulative per-process aggregates, kept as plain numbers under one lock.

The hot path updates these (well under a microsecond) instead of calling one SDK
instrument per quantity; observable instruments read them at collection time and
step_metrics() differences them. Only the latency histogram is a synchronous SDK record,
since a histogram cannot be observed."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .labels import ERROR_TYPE_LIMIT, Bounded


class OpStats:
    __slots__ = ("calls", "seconds", "errors", "read_bytes", "write_bytes", "keys", "missing",
                 "window_max")

    def __init__(self):
        self.calls = 0
        self.seconds = 0.0
        self.errors = 0
        self.read_bytes = 0
        self.write_bytes = 0
        self.keys = 0
        self.missing = 0
        self.window_max = 0.0  # slowest call since the last step_metrics()


@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    ops: dict[str, OpStats] = field(default_factory=dict)
    errors: dict[tuple[str, str], int] = field(default_factory=dict)
    # error_type's bound (labels.py): the core's ops and the accounts beside them share it
    error_type: Bounded = field(default_factory=lambda: Bounded(ERROR_TYPE_LIMIT))
    instr_seconds: dict[str, float] = field(default_factory=dict)
    instr_errors: dict[str, int] = field(default_factory=dict)
    codec_seconds: dict[str, float] = field(default_factory=dict)
    step_seconds: float = 0.0
    steps: int = 0
    occupancies: list = field(default_factory=list)  # occupancy.Occupancy, one per client
    # Accounts kept beside the core's (adapters/ray/meter.py): each an object whose
    # observe(instrument name) adds its points to the core's op instruments at collection,
    # and whose window() adds its keys to step_metrics(). Appended once, never removed.
    accounts: list = field(default_factory=list)

    def op(self, name: str) -> OpStats:
        # Called under the lock. Get-then-insert: setdefault would build a throwaway each call.
        s = self.ops.get(name)
        if s is None:
            s = self.ops[name] = OpStats()
        return s

    def add_time(self, component: str, seconds: float) -> None:
        with self.lock:
            self.instr_seconds[component] = self.instr_seconds.get(component, 0.0) + seconds

    def outstanding(self) -> tuple[float, int]:
        with self.lock:
            size = keys = 0
            for occ in self.occupancies:
                b, k = occ.totals()
                size += b
                keys += k
            return size, keys
