"""Time on the critical path (DESIGN.md): of the time a process's steps are open, how much
had a data-plane op in flight (busy) and how much a step's own thread or task was blocked on
the data plane (exposed). data_plane_s (op-seconds) stays in Stats; these two need the order
of events, so every op reports the start and end of its measured interval here.

The hot path takes no lock. begin() and end() append to deques (atomic in CPython); the
union of op intervals is folded against the steps' intervals when someone reads the totals
and at each step's end, under the lock, so memory holds one step's ops at most. A step's
exposure is only ever changed by the thread that owns it (its own thread, or the event loop
thread running its task), as one tuple replaced at once, so readers see a consistent value.
A step entered in a coroutine belongs to the task that entered it; ops of other tasks count
as exposed only while that task awaits them (asyncio_waits.py).
"""
from __future__ import annotations

import asyncio
import threading
from collections import deque
from contextvars import ContextVar
from time import perf_counter

from . import asyncio_waits

# The step open in this thread or task. Tasks copy it, so a prefetch task created inside a
# step sees the step too; `owns` tells the step's own thread or task from the others.
_STEP: ContextVar["Step | None"] = ContextVar("dpobs_step", default=None)

# How often a data-plane op in a task the step has not awaited (yet) looks whether it now
# does: the resolution of exposure in that one case (a prefetch task awaited late).
POLL_S = 0.001
# Finished ops folded early when this many wait (a process that never opens a step).
FOLD_AT = 4096


class Step:
    __slots__ = ("cp", "thread", "task", "state", "closed")

    def __init__(self, cp: "CriticalPath", thread: int, task):
        self.cp = cp  # a second Telemetry in the process keeps its own steps
        self.thread = thread
        self.task = task  # the asyncio task that entered the step, or None
        # (exposed seconds closed, since, depth): open waits nest and overlap, counted once.
        self.state = (0.0, 0.0, 0)
        self.closed = False

    def owns(self, cp: "CriticalPath") -> bool:
        """Is the caller the step's own thread (and task, for a step entered in asyncio)?"""
        if self.cp is not cp or self.thread != threading.get_ident():
            return False
        return self.task is None or asyncio_waits.current_task() is self.task

    # Called on the owning thread only.
    def enter(self, t: float) -> None:
        if not self.closed:
            acc, since, depth = self.state
            self.state = (acc, t if not depth else since, depth + 1)

    def leave(self, t: float) -> None:
        acc, since, depth = self.state
        if self.closed or not depth:
            return
        self.state = (acc + max(t - since, 0.0), since, 0) if depth == 1 else (
            acc, since, depth - 1)

    def exposed(self, now: float) -> float:
        acc, since, depth = self.state
        return acc + max(now - since, 0.0) if depth else acc


class CriticalPath:
    def __init__(self):
        self.lock = threading.Lock()  # the fold, the steps and the readings
        self._starts: deque = deque()  # t1 of ops begun, not yet folded
        self._ends: deque = deque()  # (t1, t2) of ops ended, not yet folded
        # Under the lock: ops in flight by start (a count: two may share a start), finished
        # ops and step spans not yet folded, open steps, and everything folded so far.
        self._flying: dict[float, int] = {}
        self._ops: list[tuple[float, float]] = []
        self._spans: list[tuple[float, float]] = []
        self._open: dict[Step, float] = {}
        self._horizon = 0.0  # busy time before it is final, in _busy
        self._busy = 0.0
        self._exposed = 0.0  # of closed steps

    # -- ops (the hot path: no lock) ----------------------------------------------------
    def begin(self, t1: float) -> Step | None:
        """An op's measured interval starts at t1. Returns the step it exposes (the caller
        is that step's own thread or task) or None; hand it and t1 to end()."""
        self._starts.append(t1)
        step = _STEP.get()
        if step is not None and step.owns(self):
            step.enter(t1)
            return step
        return None

    def end(self, step: Step | None, t1: float, t2: float) -> None:
        ends = self._ends
        ends.append((t1, t2))
        if step is not None:
            step.leave(t2)
        if len(ends) > FOLD_AT:
            self.totals(t2)

    def retract(self, step: Step | None, t1: float) -> None:
        """Undo begin(): the call only made an awaitable. The op is in flight, and which task
        waits for it is known, once it is awaited (awaited()); a coroutine never awaited
        never ran."""
        self.end(step, t1, t1)

    # -- steps --------------------------------------------------------------------------
    def step_begin(self, t: float) -> tuple[Step, object]:
        step = Step(self, threading.get_ident(), asyncio_waits.current_task())
        with self.lock:
            self._open[step] = max(t, self._horizon)
        return step, _STEP.set(step)

    def step_end(self, opened: tuple[Step, object], t: float) -> None:
        step, token = opened
        try:
            _STEP.reset(token)
        except ValueError:  # exited in another context than it entered: leave that one be
            pass
        exposed = step.exposed(t)  # an exposure still open ends with the step
        with self.lock:
            step.closed = True
            self._exposed += exposed
            self._spans.append((self._open.pop(step), t))
        self.totals(t)  # fold: what waits for the fold is one step's ops at most

    # -- exposure -----------------------------------------------------------------------
    def exposure(self) -> "Exposure":
        """Exposure of the caller's step while the caller blocks (tel.waiting(), next())."""
        step = _STEP.get()
        if step is None or not step.owns(self):
            return _NOT_EXPOSED
        return Exposure(step)

    async def awaited(self, awaitable, busy: bool = True):
        """Await `awaitable` (an op) in the calling task: in flight meanwhile (busy=False:
        the op counts itself, e.g. on a worker thread), exposed for the step when that task
        is the step's own or one the step awaits, now or later (a prefetch task the step
        awaits only after computing is exposed from then on)."""
        t1 = perf_counter()
        if busy:
            self._starts.append(t1)
        watch = _Watch(self, _STEP.get())
        try:
            return await awaitable
        finally:
            t2 = perf_counter()
            watch.close(t2)
            if busy:
                self.end(None, t1, t2)

    # -- reading ------------------------------------------------------------------------
    def totals(self, now: float | None = None) -> tuple[float, float]:
        """(busy_s, exposed_s) since start, intervals still open counted up to now: a later
        reading only adds to them, so the counters stay monotonic."""
        now = perf_counter() if now is None else now
        with self.lock:
            busy = self._fold(now)
            exposed = self._exposed + sum(s.exposed(now) for s in self._open)
        return busy, exposed

    def _fold(self, now: float) -> float:
        """Busy time up to now; what lies before the earliest op still in flight is final
        and leaves the lists (no op can begin before it any more)."""
        flying, starts, ends, ops = self._flying, self._starts, self._ends, self._ops
        get, pop, add = flying.get, starts.popleft, ops.append
        for _ in range(len(starts)):  # popleft is atomic: appends racing this stay queued
            t1 = pop()
            flying[t1] = get(t1, 0) + 1
        pop = ends.popleft
        for _ in range(len(ends)):
            iv = pop()
            n = get(iv[0], 0) - 1  # -1: its start is still in the deque, folded next
            if n:
                flying[iv[0]] = n
            else:
                del flying[iv[0]]
            add(iv)
        live = [t1 for t1, n in flying.items() if n > 0]
        horizon = max(min(live, default=now), self._horizon)
        if not self._open and not self._spans:  # no step to overlap, now or to come:
            self._ops, self._horizon = [], horizon  # a finished op cannot count any more
            return self._busy
        ops = self._ops + [(t1, now) for t1 in live]
        steps = self._spans + [(t0, now) for t0 in self._open.values()]
        self._busy += _overlap(ops, steps, self._horizon, horizon)
        self._horizon = horizon
        self._ops = [iv for iv in self._ops if iv[1] > horizon]
        self._spans = [iv for iv in self._spans if iv[1] > horizon]
        return self._busy + _overlap(ops, steps, horizon, now)


def _overlap(ops, steps, lo: float, hi: float) -> float:
    """Time within [lo, hi] during which some op and some step are both open: one sweep
    over the sorted starts and ends."""
    if hi <= lo:
        return 0.0
    events = [(t, kind, d) for kind, spans in ((0, ops), (1, steps))
              for a, b in spans for t, d in ((a, 1), (b, -1))]
    events.sort()
    open_, last, total = [0, 0], lo, 0.0
    for t, kind, d in events:
        if open_[0] and open_[1]:
            total += max(min(t, hi) - max(last, lo), 0.0)
        open_[kind] += d
        last = t
    return total


class Exposure:
    """`with`: the step's own thread blocked on the data plane for the block's duration."""
    __slots__ = ("_step",)

    def __init__(self, step: Step):
        self._step = step

    def __enter__(self):
        self._step.enter(perf_counter())
        return self

    def __exit__(self, *exc):
        self._step.leave(perf_counter())


class _NotExposed:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


_NOT_EXPOSED = _NotExposed()


class _Watch:
    """Exposure of one awaited op in the task awaiting it: from now when the step's task is
    that task or awaits it; otherwise looked for every POLL_S until the op ends."""
    __slots__ = ("_step", "_task", "_exposed", "_handle")

    def __init__(self, cp: CriticalPath, step: Step | None):
        self._step, self._task, self._exposed, self._handle = step, None, False, None
        if step is None or step.cp is not cp or step.thread != threading.get_ident():
            self._step = None
            return
        if step.task is None:  # a synchronous step running an event loop: it blocks on us
            self._start(perf_counter())
            return
        self._task = asyncio_waits.current_task()
        self._look()

    def _look(self) -> None:
        self._handle = None
        step = self._step
        if step.closed:
            return
        if self._task is step.task or asyncio_waits.awaits(step.task, self._task):
            self._start(perf_counter())
        else:
            self._handle = asyncio.get_running_loop().call_later(POLL_S, self._look)

    def _start(self, t: float) -> None:
        self._exposed = True
        self._step.enter(t)

    def close(self, t: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        if self._exposed:
            self._step.leave(t)
