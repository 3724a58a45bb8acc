"""Time on the critical path (DESIGN.md): of the time a process's steps are open, how much
had a data-plane op in flight (busy) and how much a step's own thread or task was blocked on
the data plane (exposed). data_plane_s (op-seconds) stays in Stats; these two need the order
of events, so every op reports the start and end of its measured interval here.

Busy time is kept as it happens: a count of ops in flight and of open steps, under one lock,
and the time both were nonzero. A step's exposure is only ever changed by the thread that
owns it (its own thread, or the event loop thread running its task), as one tuple replaced
at once, so readers see a consistent value without the lock.
A step entered in a coroutine belongs to the task that entered it; ops of other tasks count
as exposed only while that task awaits them (asyncio_tasks.py).
"""
from __future__ import annotations

import asyncio
import threading
from contextvars import ContextVar
from time import perf_counter

from .shims import asyncio_tasks

# The step open in this thread or task. Tasks copy it, so a prefetch task created inside a
# step sees the step too; `owns` tells the step's own thread or task from the others.
_STEP: ContextVar["Step | None"] = ContextVar("dpobs_step", default=None)

# How often a data-plane op in a task the step has not awaited (yet) looks whether it now
# does: the resolution of exposure in that one case (a prefetch task awaited late).
POLL_S = 0.001


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
        return self.task is None or asyncio_tasks.current_task() is self.task

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


def _reraise(exc: BaseException) -> None:
    raise exc


class CriticalPath:
    def __init__(self):
        self.lock = threading.Lock()
        self._steps: set[Step] = set()  # open steps
        self._inflight = 0
        self._busy_since = 0.0
        self._busy = 0.0
        self._exposed = 0.0  # of closed steps
        # What totals() last handed out. An op's end time is read before end() takes the
        # lock, so a reading in between counts the interval up to its own later clock; the
        # counters must never go back (Prometheus reads any decrease as a reset and adds the
        # whole value to the rate: busy_frac read high on TransferQueue that way; the figure
        # is in docs/development/performance.md, "Time on the critical path").
        self._reported = (0.0, 0.0)
        # For add_past(): when ops in flight last fell to none, and the latest past interval's
        # end; busy up to either is counted already.
        self._idle_since = 0.0
        self._past_end = 0.0

    # -- ops ----------------------------------------------------------------------------
    # begin() and end() run on every op: one short lock hold each, taken with
    # acquire/release (cheaper than `with`: docs/development/performance.md). Events arrive in time order but
    # for the instant between reading the clock and taking the lock.
    def begin(self, t1: float) -> Step | None:
        """An op's measured interval starts at t1. Returns the step it exposes (the caller
        is that step's own thread or task) or None; hand it and t1 to end()."""
        return self._begin(t1)[0]

    def start(self) -> tuple[Step | None, float]:
        """begin() at a clock it reads itself once it holds the lock: (step, t1). What begin
        waited for (the lock, the GIL behind it) and the step lookup stay outside the op's
        measured interval, which is the store call's (in the demo, begin(perf_counter())
        put that work, and a lost core's wait, inside the op's duration: the figures are in
        docs/native-histograms.md)."""
        return self._begin(None)

    def _begin(self, t1: float | None) -> tuple[Step | None, float]:
        step = _STEP.get()
        if step is not None and not step.owns(self):
            step = None
        t1 = self._in_flight(t1)
        if step is not None:
            step.enter(t1)
        return step, t1

    def end(self, step: Step | None, t1: float, t2: float) -> None:
        lock = self.lock
        lock.acquire()
        try:
            self._inflight -= 1
            if not self._inflight:
                self._idle_since = t2
                if self._steps:
                    self._busy += max(t2 - self._busy_since, 0.0)
        finally:
            lock.release()
        if step is not None:
            step.leave(t2)

    def retract(self, step: Step | None, t1: float) -> None:
        """Undo begin(): the call only made an awaitable. The op is in flight, and which task
        waits for it is known, once it is awaited (awaited()); a coroutine never awaited
        never ran."""
        self.end(step, t1, t1)

    def add_past(self, t1: float, t2: float) -> None:
        """A data-plane interval [t1, t2] learned only at its end, on the op's own thread (a
        Ray get's tail: the part after its last object existed). Busy: the part of it no
        other op's interval counted (the latest such intervals: gaps between earlier ones
        inside it are left out); exposed: all of it when the caller is the step's own thread
        and not inside an exposure already open (tel.waiting()). One lock hold; nothing at
        all while no step is open."""
        if not self._steps or t2 <= t1:
            return
        lock = self.lock
        lock.acquire()
        try:
            if self._steps:
                lo = max(t1, self._idle_since, self._past_end)
                hi = min(t2, self._busy_since) if self._inflight else t2
                if hi > lo:
                    self._busy += hi - lo
                if t2 > self._past_end:
                    self._past_end = t2
        finally:
            lock.release()
        step = _STEP.get()
        if step is not None and step.owns(self) and not step.closed:
            acc, since, depth = step.state
            if not depth:
                step.state = (acc + (t2 - t1), since, 0)

    def _in_flight(self, t: float | None) -> float:
        """One more op in flight from t (None: the clock, read under the lock); returns t."""
        lock = self.lock
        lock.acquire()
        try:
            if t is None:
                t = perf_counter()
            self._inflight += 1
            if self._inflight == 1 and self._steps:
                self._busy_since = t
        finally:
            lock.release()
        return t

    # -- steps --------------------------------------------------------------------------
    def step_begin(self, t: float) -> tuple[Step, object]:
        step = Step(self, threading.get_ident(), asyncio_tasks.current_task())
        with self.lock:
            if not self._steps and self._inflight:
                self._busy_since = t
            self._steps.add(step)
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
            self._steps.discard(step)
            if not self._steps and self._inflight:
                self._busy += max(t - self._busy_since, 0.0)

    def owned_step(self) -> Step | None:
        """The step open on the caller's thread (or task) that the caller owns, else None."""
        step = _STEP.get()
        return step if step is not None and step.owns(self) else None

    # -- exposure -----------------------------------------------------------------------
    def exposure(self) -> "Exposure":
        """Exposure of the caller's step while the caller blocks (tel.waiting(), next())."""
        step = _STEP.get()
        if step is None or not step.owns(self):
            return _NOT_EXPOSED
        return Exposure(step)

    async def awaited(self, awaitable, busy: bool = True, failed=_reraise):
        """Await `awaitable` (an op) in the calling task: in flight meanwhile (busy=False:
        the op counts itself, e.g. on a worker thread), exposed for the step when that task
        is the step's own or one the step awaits, now or later (a prefetch task the step
        awaits only after computing is exposed from then on). failed(exc): this
        bookkeeping itself raised; the op is awaited all the same, and its result or its
        exception reaches the caller unchanged."""
        t1 = perf_counter()
        try:
            if busy:
                self._in_flight(t1)
            watch = _Watch(self, _STEP.get())
        except Exception as exc:
            failed(exc)
            return await awaitable
        try:
            return await awaitable
        finally:
            try:
                t2 = perf_counter()
                watch.close(t2)
                if busy:
                    self.end(None, t1, t2)
            except Exception as exc:  # never in place of the op's own outcome
                failed(exc)

    # -- reading ------------------------------------------------------------------------
    def totals(self, now: float | None = None) -> tuple[float, float]:
        """(busy_s, exposed_s) since start, intervals still open counted up to now; never
        less than an earlier reading."""
        now = perf_counter() if now is None else now
        with self.lock:
            busy = self._busy
            if self._steps and self._inflight:
                busy += max(now - self._busy_since, 0.0)
            exposed = self._exposed + sum(s.exposed(now) for s in self._steps)
            last_busy, last_exposed = self._reported
            self._reported = busy, exposed = max(busy, last_busy), max(exposed, last_exposed)
        return busy, exposed


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
        self._task = asyncio_tasks.current_task()
        self._look()

    def _look(self) -> None:
        self._handle = None
        step = self._step
        if step.closed:
            return
        if self._task is step.task or asyncio_tasks.awaits(step.task, self._task):
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
