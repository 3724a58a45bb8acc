"""The workload's own clock for critical-path tests: intervals the test itself measured
(steps, store calls, waits), and the busy/exposed truth computed from them with the demo's
interval arithmetic (demo/truth.py), which shares nothing with dpobs's critical.py."""
from __future__ import annotations

import asyncio
import threading
import time
from contextlib import contextmanager

from dpobs_otel.demo.truth import intersect, length, union


class Clock:
    """Records intervals by kind, thread-safely: `with clock.span("call"): ...`."""

    def __init__(self):
        self.spans: dict[str, list[tuple[float, float, int]]] = {}  # kind -> (t0, t1, thread)
        self._lock = threading.Lock()

    @contextmanager
    def span(self, kind: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            t1 = time.perf_counter()
            with self._lock:
                self.spans.setdefault(kind, []).append((t0, t1, threading.get_ident()))

    def of(self, kind: str) -> list[tuple[float, float]]:
        return [(a, b) for a, b, _ in self.spans.get(kind, [])]

    def per_thread(self, kind: str) -> float:
        """Each thread's spans merged, summed over threads: two step threads blocked at the
        same moment are two steps' stalls."""
        threads: dict[int, list] = {}
        for a, b, tid in self.spans.get(kind, []):
            threads.setdefault(tid, []).append((a, b))
        return sum(length(union(spans)) for spans in threads.values())

    def step_s(self) -> float:
        return sum(b - a for a, b in self.of("step"))

    def busy_s(self) -> float:
        """Wall time a store call was in flight while a step was open."""
        return length(intersect(union(self.of("call")), union(self.of("step"))))

    def fracs(self, blocked: str = "blocked") -> tuple[float, float]:
        """(busy, exposed) truth as fractions of step time; exposed is the spans of kind
        `blocked` the test recorded (the step's own thread waiting on data)."""
        step = self.step_s()
        return self.busy_s() / step, self.per_thread(blocked) / step


class SlowStore:
    """The in-memory reference store behind a fixed service time, each call recorded on the
    clock as "call" (the truth's op interval)."""

    def __init__(self, inner, clock: Clock, latency_s: float):
        self._inner, self._clock, self.latency_s = inner, clock, latency_s

    def put_samples(self, *a, **k):
        with self._clock.span("call"):
            time.sleep(self.latency_s)
            return self._inner.put_samples(*a, **k)

    def get_samples(self, *a, **k):
        with self._clock.span("call"):
            time.sleep(self.latency_s)
            return self._inner.get_samples(*a, **k)


class AsyncStore:
    """The same store with coroutine methods (`async def`): what an asyncio data plane is."""

    def __init__(self, inner, clock: Clock, latency_s: float):
        self._inner, self._clock, self.latency_s = inner, clock, latency_s

    async def put_samples(self, *a, **k):
        with self._clock.span("call"):
            await asyncio.sleep(self.latency_s)
            return self._inner.put_samples(*a, **k)

    async def get_samples(self, *a, **k):
        with self._clock.span("call"):
            await asyncio.sleep(self.latency_s)
            return self._inner.get_samples(*a, **k)


class CoroutineReturningStore(AsyncStore):
    """Plain methods that return a coroutine (TransferQueue's client wrappers are these)."""

    def get_samples(self, *a, **k):  # noqa: D401 - not a coroutine function itself
        return AsyncStore.get_samples(self, *a, **k)
