"""Time on the critical path (DESIGN.md): of the time a process's steps are open, how much
had a data-plane op in flight (busy) and how much a step's own thread or task was blocked on
the data plane (exposed). data_plane_s (op-seconds) stays in Stats; these two need the order
of events, so every op reports the start and end of its measured interval here.

One lock guards the process's counts. A step's exposure depth is touched only by the thread
(or event loop) that owns the step, plus the lock for the totals: steps on other threads
never share one. A step owned by a coroutine belongs to the task that entered it; ops of
other tasks count as exposed only while that task awaits them (asyncio_waits.py).
"""
from __future__ import annotations

import asyncio
import threading
from contextvars import ContextVar
from time import perf_counter

from . import asyncio_waits

# The step open in this thread or task. Tasks copy it, so a prefetch task created inside a
# step sees the step too; `owns` tells the step's own thread or task from the others.
_STEP: ContextVar["Step | None"] = ContextVar("dpobs_step", default=None)

# How often a data-plane op in a task the step has not awaited (yet) looks whether it now
# does: the resolution of exposure in that one case (a prefetch task awaited late).
POLL_S = 0.001


class Step:
    __slots__ = ("thread", "task", "depth", "since", "closed")

    def __init__(self, thread: int, task):
        self.thread = thread
        self.task = task  # the asyncio task that entered the step, or None
        self.depth = 0  # open exposures (nested or overlapping waits count once)
        self.since = 0.0
        self.closed = False

    def owns(self) -> bool:
        """Is the caller the step's own thread (and task, for a step entered in asyncio)?"""
        if self.thread != threading.get_ident():
            return False
        return self.task is None or asyncio_waits.current_task() is self.task


class CriticalPath:
    def __init__(self):
        self.lock = threading.Lock()
        self._steps: set[Step] = set()  # open steps
        self._inflight = 0
        self._busy_since = 0.0
        self._busy = 0.0
        self._exposed = 0.0

    # -- steps --------------------------------------------------------------------------
    def step_begin(self, t: float) -> tuple[Step, object]:
        step = Step(threading.get_ident(), asyncio_waits.current_task())
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
        with self.lock:
            if step.depth:  # an exposure still open ends with the step
                self._exposed += max(t - step.since, 0.0)
            step.closed = True
            self._steps.discard(step)
            if not self._steps and self._inflight:
                self._busy += max(t - self._busy_since, 0.0)

    # -- ops ----------------------------------------------------------------------------
    def begin(self, t: float) -> Step | None:
        """An op's measured interval starts at t. Returns the step it exposes (the caller is
        that step's own thread or task) or None; hand it to end()."""
        self._in_flight(t)
        step = _STEP.get()
        if step is not None and step.owns():
            self._expose(step, t)
            return step
        return None

    def end(self, step: Step | None, t: float) -> None:
        with self.lock:
            self._inflight -= 1
            if not self._inflight and self._steps:
                self._busy += max(t - self._busy_since, 0.0)
        if step is not None:
            self._unexpose(step, t)

    def retract(self, step: Step | None) -> None:
        """Undo begin(): the call only made an awaitable. The op is in flight, and which task
        waits for it is known, once it is awaited (awaited()); a coroutine never awaited
        never ran."""
        with self.lock:
            self._inflight -= 1  # an interval this begin() opened closes with nothing in it
            if step is not None and not step.closed and step.depth:
                step.depth -= 1

    def _in_flight(self, t: float) -> None:
        with self.lock:
            self._inflight += 1
            if self._inflight == 1 and self._steps:
                self._busy_since = t

    # -- exposure -----------------------------------------------------------------------
    def _expose(self, step: Step, t: float) -> None:
        with self.lock:
            if step.closed:
                return
            if not step.depth:
                step.since = t
            step.depth += 1

    def _unexpose(self, step: Step, t: float) -> None:
        with self.lock:
            if step.closed or not step.depth:
                return
            step.depth -= 1
            if not step.depth:
                self._exposed += max(t - step.since, 0.0)

    def exposure(self) -> "Exposure":
        """Exposure of the caller's step while the caller blocks (tel.waiting(), next())."""
        step = _STEP.get()
        if step is None or not step.owns():
            return _NOT_EXPOSED
        return Exposure(self, step)

    async def awaited(self, awaitable, busy: bool = True):
        """Await `awaitable` (an op) in the calling task: in flight meanwhile (busy=False:
        the op counts itself, e.g. on a worker thread), exposed for the step when that task
        is the step's own or one the step awaits, now or later (a prefetch task the step
        awaits only after computing is exposed from then on)."""
        if busy:
            self._in_flight(perf_counter())
        watch = _Watch(self, _STEP.get())
        try:
            return await awaitable
        finally:
            t = perf_counter()
            watch.close(t)
            if busy:
                self.end(None, t)

    # -- reading ------------------------------------------------------------------------
    def totals(self, now: float | None = None) -> tuple[float, float]:
        """(busy_s, exposed_s) since start, intervals still open counted up to now: a later
        reading only adds to them, so the counters stay monotonic."""
        now = perf_counter() if now is None else now
        with self.lock:
            busy, exposed = self._busy, self._exposed
            if self._steps and self._inflight:
                busy += max(now - self._busy_since, 0.0)
            for step in self._steps:
                if step.depth:
                    exposed += max(now - step.since, 0.0)
        return busy, exposed


class Exposure:
    """`with`: the step's own thread blocked on the data plane for the block's duration."""
    __slots__ = ("_cp", "_step")

    def __init__(self, cp: CriticalPath, step: Step):
        self._cp = cp
        self._step = step

    def __enter__(self):
        self._cp._expose(self._step, perf_counter())
        return self

    def __exit__(self, *exc):
        self._cp._unexpose(self._step, perf_counter())


class _NotExposed:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


_NOT_EXPOSED = _NotExposed()


class _Watch:
    """Exposure of one awaited op in the task awaiting it: from now when the step's task is
    that task or awaits it; otherwise looked for every POLL_S until the op ends."""
    __slots__ = ("_cp", "_step", "_task", "_exposed", "_handle")

    def __init__(self, cp: CriticalPath, step: Step | None):
        self._cp, self._step, self._exposed, self._handle = cp, step, False, None
        self._task = None
        if step is None or step.thread != threading.get_ident():
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
        self._cp._expose(self._step, t)

    def close(self, t: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        if self._exposed:
            self._cp._unexpose(self._step, t)
