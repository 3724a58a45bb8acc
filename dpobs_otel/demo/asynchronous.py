"""`dpobs demo --async K`: the workload without a barrier between the rollout and the trainers.

The rollout puts step after step, up to K steps ahead of the slowest trainer; each trainer
waits for its step's rows inside tel.waiting() (exposed time: a consumer starved by its
producer), reads them, trains, and says so; the driver clears a step once every trainer has
read it. Who waits for whom is then visible: a slow rollout (--rollout-ms) leaves trainers
waiting on an empty store, a slow trainer (--train-ms) leaves rows ageing in the store, K
steps' worth, while trainers never wait.

The row age truth is the workload's own wall clock: the rollout writes each step's put time
(before and after the call) into shared memory, each trainer takes its read's times (before
and after), so a row's true age lies between read start - put end and read end - put start.

Step 0 is the warm-up, as in the lockstep workload: every process does it, reports, and the
rollout waits for the parent's go (sync.measure) before step 1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from time import perf_counter

from .batches import PARTITION, sample_ids

POLL_S = 0.0005  # how often a waiting process looks again (shared memory: no round trip)


@dataclass
class Queue:
    """The shared state of an --async run (multiprocessing Values and Arrays)."""
    decided: object  # Value: the last step the rollout has decided to run (-1: none yet)
    produced: object  # Value: the last step the rollout has put (-1: none yet)
    last: object  # Value: the final step, once the rollout has stopped (-1: running)
    consumed: object  # Array: per trainer, the last step it has read
    put_times: object  # Array: per step slot, (start, end) of its put, wall clock

    @classmethod
    def make(cls, ctx, trainers: int, k: int) -> "Queue":
        slots = k + 2  # steps in flight at most: K ahead plus the one being read
        return cls(ctx.Value("i", -1), ctx.Value("i", -1), ctx.Value("i", -1),
                   ctx.Array("i", [-1] * trainers), ctx.Array("d", [0.0] * (2 * slots)))

    def slot(self, step: int) -> int:
        return 2 * (step % (len(self.put_times) // 2))


def loop(w, compute) -> None:
    """A workload _Worker's steps in --async mode (workload.py's loop, without barriers);
    compute(ms) is a role's compute for a step."""
    q, step = w.sync.queue, 0
    w.compute = compute
    w.dp, w.client = w.on[0], _Clocked(w.on[1])
    while _more(w, q, step):
        t0 = perf_counter()
        with w.dp.step():
            getattr(_ROLES, w.role)(w, q, step)
        w.truth.step(t0, perf_counter())
        if step == 0:
            w.out.put(("warm", w.role, w.rank, w.truth.take()))
        step += 1


def _more(w, q: Queue, step: int) -> bool:
    """Does this process run `step`? The rollout decides (then waits for room and computes
    inside the step); the others follow its decision, and wait for its rows inside theirs."""
    if w.role == "rollout":
        go = w._decide(step)
        if go:
            q.decided.value = step
        else:
            q.last.value = step - 1
        return go
    if step == 1:  # the measured steps start when the rollout's do, not during the scrape
        w._wait_measure()
    started = q.produced if step == 0 else q.decided  # the warm-up: not the others' start-up
    while True:
        last = q.last.value
        if last >= 0:
            return step <= last
        if started.value >= step:
            return True
        time.sleep(POLL_S)


class _ROLES:
    @staticmethod
    def rollout(w, q: Queue, step: int) -> None:
        # at most K steps ahead of the step the slowest trainer is on (its last read + 1)
        _until(lambda: step - (min(q.consumed) + 1) <= w.cfg.async_k)
        w.compute(w.cfg.rollout_ms)
        w._put(step)
        t0, t1 = w.client.spans.pop()  # the put's call: its rows' stamp lies inside
        w.client.spans.clear()
        i = q.slot(step)
        q.put_times[i], q.put_times[i + 1] = t0, t1
        q.produced.value = step
        if step >= 1:
            w.out.put(("step", step, t1 - getattr(w, "_t_prev", t0), True))
        w._t_prev = t1

    @staticmethod
    def trainer(w, q: Queue, step: int) -> None:
        with w.truth.waiting(), w.dp.waiting():  # rows not there yet: the consumer waits
            _until(lambda: q.produced.value >= step)
        i = q.slot(step)
        put0, put1 = q.put_times[i], q.put_times[i + 1]
        shards = w._read(step)
        age = w.truth.extra.setdefault("row_age", [0.0, 0.0, 0])
        for td, (r0, r1) in zip(shards, w.client.spans):
            rows = td.batch_size[0]
            age[0] += (r0 - put1) * rows  # the true ages lie between these two bounds
            age[1] += (r1 - put0) * rows
            age[2] += rows
        w.client.spans.clear()
        w.compute(w.cfg.train_ms)
        q.consumed[w.rank] = step

    @staticmethod
    def driver(w, q: Queue, step: int) -> None:
        if step == 0:
            w.client.register_partition(PARTITION)
        _until(lambda: min(q.consumed) >= step)
        mine = set(sample_ids(step, w.cfg.batch_size))
        ids = [i for i in w.client.list_sample_ids(PARTITION) if i in mine]
        w.client.clear_samples(ids, PARTITION)


class _Clocked:
    """The instrumented client, with the wall-clock span of each put and get it makes (the
    stamp is taken inside the put, the age observed inside the get)."""

    def __init__(self, client):
        self._client = client
        self.spans: list[tuple[float, float]] = []

    def __getattr__(self, name):
        return getattr(self._client, name)

    def put_samples(self, *args, **kwargs):
        return self._spanned(self._client.put_samples, args, kwargs)

    def get_samples(self, *args, **kwargs):
        return self._spanned(self._client.get_samples, args, kwargs)

    def _spanned(self, fn, args, kwargs):
        t0 = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            self.spans.append((t0, time.time()))


def _until(ready) -> None:
    while not ready():
        time.sleep(POLL_S)
