"""Cumulative per-process aggregates, kept as plain numbers under one lock.

The hot path updates these (well under a microsecond) instead of calling one SDK
instrument per quantity; observable instruments read them at collection time and
step_metrics() differences them. Only the latency histogram is a synchronous SDK record,
since a histogram cannot be observed."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field


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


class Occupancy:
    """What one client has put and not cleared: a live-key set and a byte total per partition.

    There is no per-key truth to keep (a put's bytes spread evenly over its keys), so a
    partial clear releases bytes pro rata and clearing the last key releases the remainder
    exactly: a partition returns to zero however it is chopped up."""

    __slots__ = ("keys", "bytes")

    def __init__(self):
        self.keys: dict[str, set[str]] = {}
        self.bytes: dict[str, float] = {}

    def add(self, partition: str, ids, nbytes: int) -> None:
        live = self.keys.get(partition)
        if live is None:
            live = self.keys[partition] = set()
            self.bytes[partition] = 0.0
        live.update(ids)
        self.bytes[partition] += nbytes

    def release(self, partition: str, ids) -> int:
        """Forget `ids` (None: all). Returns how many live keys went."""
        live = self.keys.get(partition)
        if not live:
            return 0
        before = len(live)
        if ids is None:
            live.clear()
        else:
            live.difference_update(ids)
        gone = before - len(live)
        if not live:
            del self.keys[partition]
            del self.bytes[partition]
        elif gone:
            self.bytes[partition] *= len(live) / before
        return gone

    def totals(self) -> tuple[float, int]:
        return sum(self.bytes.values()), sum(len(k) for k in self.keys.values())


@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    ops: dict[str, OpStats] = field(default_factory=dict)
    errors: dict[tuple[str, str], int] = field(default_factory=dict)
    instr_seconds: dict[str, float] = field(default_factory=dict)
    instr_errors: dict[str, int] = field(default_factory=dict)
    codec_seconds: dict[str, float] = field(default_factory=dict)
    step_seconds: float = 0.0
    steps: int = 0
    occupancies: list[Occupancy] = field(default_factory=list)

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
