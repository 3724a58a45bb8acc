"""The per-process ring of spans: ops, steps and waits, kept as compact records.

The hot path appends one tuple to a bounded deque (thread-safe in CPython, the oldest record
dropped when full): building an OpenTelemetry SDK span per op costs more than the whole
per-op budget (docs/guides/timeline.md, "The ring", has the figure and its command), so SDK spans
are made from the records off the hot path, only when an OTLP exporter asks for them
(otlp.py). Times are the caller's perf_counter() readings, turned into wall-clock
nanoseconds when the ring is read.

Sampling is per step: a step is traced when its number (1-based, the process's count of
steps since start) is 1 modulo `every`. An op belongs to the step its thread or task opened
(a context variable, so an asyncio task inherits its step); an op on a thread with no step
of its own follows the process's step open at the time (the last one opened); with no step
open anywhere it is kept when every step is traced (every == 1)."""
from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from contextvars import ContextVar
from itertools import count

# Record kinds (the first field of every record).
OP, STEP, WAIT, WEIGHTS = "op", "step", "wait", "weights"
SKIPPED = -1  # a step that is not sampled, in the context variable and in _open
_NO_STEP = None


class Tracer:
    def __init__(self, size: int = 16384, every: int = 1, resource: dict | None = None):
        self.size, self.every = size, every
        self.resource = dict(resource or {})
        self.ring: deque = deque(maxlen=size)
        self.pending: deque | None = None  # records an exporter has not taken yet
        self._step: ContextVar = ContextVar(f"dpobs_step_{id(self)}", default=_NO_STEP)
        self._steps = count(1)
        self._open = _NO_STEP  # the process's last opened step still open
        self._n_open = 0
        self._lock = threading.Lock()
        self._threads: dict[int, str] = {}
        self.appended = 0  # records ever kept (the ring holds the last `size`)

    # -- the hot path ---------------------------------------------------------------------
    def op(self, op: str, t0: float, t1: float, partition=None, keys: int = 0,
           nbytes: int = 0, error: str | None = None) -> None:
        """One data-plane op measured from t0 to t1 (perf_counter seconds)."""
        step = self._step.get()
        if step is _NO_STEP:
            step = self._open
            if step is _NO_STEP and self.every != 1:
                return
        if step == SKIPPED:
            return
        self._keep((OP, op, t0, t1, self._tid(), step, partition, keys, nbytes, error))

    def failed(self, op: str, dt: float, error: str) -> None:
        """A failed op that took dt seconds, ending now (the failure paths know no more)."""
        t = time.perf_counter()
        self.op(op, t - dt, t, None, 0, 0, error)

    @staticmethod
    def partition_of(args, kwargs):
        """A generic op's partition, for its span: partition_id=, else a leading string."""
        pid = kwargs.get("partition_id")
        if pid is None and args and isinstance(args[0], str):
            pid = args[0]
        return pid

    def wait(self, t0: float, t1: float, kind: str = "waiting") -> None:
        """An exposed wait of the step's own thread or task (tel.waiting(), tel.exposed())."""
        step = self._step.get()
        if step is not _NO_STEP and step != SKIPPED:
            self._keep((WAIT, kind, t0, t1, self._tid(), step))

    def weights(self, side: str, version: int, t0: float, t1: float, nbytes: int,
                tensors: int) -> None:
        """One side of one weight sync (weights/), kept like an op: in the step open here."""
        step = self._step.get()
        if step is _NO_STEP:
            step = self._open
        if step != SKIPPED:
            self._keep((WEIGHTS, side, t0, t1, self._tid(), step, version, nbytes, tensors))

    @contextlib.contextmanager
    def waiting(self, inner, kind: str):
        """`inner` (an exposure's context) as a wait span from entry to exit."""
        t0 = time.perf_counter()
        try:
            with inner:
                yield
        finally:
            self.wait(t0, time.perf_counter(), kind)

    def step_begin(self):
        """Open a step on this thread or task; returns the handle step_end takes."""
        n = next(self._steps)
        mark = n if (n - 1) % self.every == 0 else SKIPPED
        token = self._step.set(mark)
        with self._lock:
            self._open = mark
            self._n_open += 1
        return token, mark

    def step_end(self, handle, t0: float, t1: float) -> None:
        token, mark = handle
        try:
            self._step.reset(token)
        except ValueError:  # closed in another context than it opened in: leave that one be
            pass
        with self._lock:
            self._n_open -= 1
            if self._n_open <= 0:
                self._n_open, self._open = 0, _NO_STEP
        if mark != SKIPPED:
            self._keep((STEP, "step", t0, t1, self._tid(), mark))

    def _tid(self) -> int:
        tid = threading.get_ident()
        if tid not in self._threads:
            self._threads[tid] = threading.current_thread().name
        return tid

    def _keep(self, rec: tuple) -> None:
        self.ring.append(rec)
        self.appended += 1  # unlocked: a count for "dropped", exact on one thread
        if self.pending is not None:
            self.pending.append(rec)

    # -- reading ---------------------------------------------------------------------------
    def thread_names(self) -> dict[int, str]:
        return dict(list(self._threads.items()))

    def snapshot(self, steps: int | None = None) -> dict:
        """The ring as JSON-able spans with wall-clock nanoseconds; `steps`: only the spans
        that end after the start of the process's last `steps` traced steps."""
        recs = list(self.ring)
        to_wall = wall_clock()
        spans = [span(r, to_wall) for r in recs]
        if steps is not None:
            spans = last_steps(spans, steps)
        return {"format": FORMAT, "resource": self.resource,
                "threads": {str(t): n for t, n in self.thread_names().items()},
                "ring": {"size": self.size, "every": self.every,
                         "dropped": max(self.appended - self.size, 0)},
                "now_ns": time.time_ns(), "spans": spans}


FORMAT = "dpobs-trace/1"


def wall_clock():
    """perf_counter seconds -> wall-clock (Unix) nanoseconds, from one reading of both."""
    offset = time.time_ns() - round(time.perf_counter() * 1e9)
    return lambda t: round(t * 1e9) + offset


def span(rec: tuple, to_wall) -> dict:
    """One record as a span: name, start and end (Unix ns), thread id, attributes."""
    kind, what, t0, t1, tid, step = rec[:6]
    attrs = {"step": step} if step is not _NO_STEP else {}
    if kind == OP:
        partition, keys, nbytes, error = rec[6:]
        attrs.update(op=what, keys=keys, bytes=nbytes)
        if partition is not None:
            attrs["partition"] = str(partition)
        if error is not None:
            attrs["error.type"] = error
        name = f"dpobs.{what}"
    elif kind == WAIT:
        attrs["wait"] = what
        name = "dpobs.wait"
    elif kind == WEIGHTS:
        version, nbytes, tensors = rec[6:]
        attrs.update(side=what, version=version, bytes=nbytes, tensors=tensors)
        name = "dpobs.weights"
    else:
        name = "dpobs.step"
    return {"name": name, "kind": kind, "start_ns": to_wall(t0), "end_ns": to_wall(t1),
            "tid": tid, "attributes": attrs}


def last_steps(spans: list[dict], n: int) -> list[dict]:
    """The spans that end after the start of the last n step spans (all when fewer)."""
    starts = sorted(s["start_ns"] for s in spans if s["kind"] == STEP)
    if n <= 0:
        return []
    if len(starts) <= n:
        return spans
    since = starts[-n]
    return [s for s in spans if s["end_ns"] > since]
