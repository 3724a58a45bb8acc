"""What the three numbers say for the workloads where op-seconds mislead (issue: time on the
critical path): the in-memory store behind a 40 ms service time, and

  prefetch  a trainer reads its next batch on a thread while it computes 100 ms, waiting
            for it inside tel.waiting();
  pool8     eight gets in flight at once from a thread pool, awaited inside tel.waiting();
  async     a client whose methods are coroutines, four gets gathered per step.

For each: frac_of_step (op-seconds / step time), busy_frac and exposed_frac from
tel.step_metrics(), beside the truth the workload measures itself (time it was blocked on
data, and time a call was in flight while a step was open).

    .venv/bin/python benchmarks/critical_path.py [--steps 10]
"""
from __future__ import annotations

import argparse
import asyncio
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel.demo.truth import intersect, length, union

LAT, COMPUTE = 0.040, 0.100
IDS = [f"s{i}" for i in range(4)]


class Clock:
    def __init__(self):
        self.spans: dict[str, list] = {"step": [], "call": [], "blocked": []}

    @contextmanager
    def span(self, kind):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spans[kind].append((t0, time.perf_counter()))

    def truth(self) -> tuple[float, float]:
        steps = union(self.spans["step"])
        step_s = length(steps)
        busy = length(intersect(union(self.spans["call"]), steps))
        return busy / step_s, length(union(self.spans["blocked"])) / step_s


class Store:
    def __init__(self, clock):
        self.inner, self.clock = dpobs.InMemoryDataPlane(), clock
        self.inner.put_samples(IDS, "p", TensorDict({"x": torch.ones(4, 8)}, batch_size=[4]))

    def get_samples(self, *a):
        with self.clock.span("call"):
            time.sleep(LAT)
            return self.inner.get_samples(*a)


class AsyncStore(Store):
    async def get_samples(self, *a):
        with self.clock.span("call"):
            await asyncio.sleep(LAT)
            return self.inner.get_samples(*a)


def prefetch(tel, clock, steps):
    client = tel.instrument(Store(clock))
    q: queue.Queue = queue.Queue(maxsize=1)
    t = threading.Thread(target=lambda: [q.put(client.get_samples(IDS, "p"))
                                         for _ in range(steps)])
    t.start()
    for _ in range(steps):
        with clock.span("step"), tel.step():
            with clock.span("blocked"), tel.waiting():
                q.get()
            time.sleep(COMPUTE)
    t.join()


def pool8(tel, clock, steps):
    client = tel.instrument(Store(clock))
    with ThreadPoolExecutor(8) as pool:
        for _ in range(steps):
            with clock.span("step"), tel.step():
                futures = [pool.submit(client.get_samples, IDS, "p") for _ in range(8)]
                with clock.span("blocked"), tel.waiting():
                    [f.result() for f in futures]


def async_client(tel, clock, steps):
    client = tel.instrument(AsyncStore(clock))

    async def main():
        for _ in range(steps):
            with clock.span("step"), tel.step():
                with clock.span("blocked"):
                    await asyncio.gather(*(client.get_samples(IDS, "p") for _ in range(4)))
    asyncio.run(main())


WORKLOADS = {"prefetch": prefetch, "pool8": pool8, "async": async_client}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    print(f"{'workload':<10}{'frac_of_step':>14}{'busy_frac':>11}{'truth':>8}"
          f"{'exposed_frac':>14}{'truth':>8}")
    for name, run in WORKLOADS.items():
        tel, clock = dpobs.start(role="bench"), Clock()
        try:
            run(tel, clock, args.steps)
            m = tel.step_metrics()
        finally:
            tel.shutdown()
        busy, exposed = clock.truth()
        print(f"{name:<10}{m['dpobs/frac_of_step']:>14.3f}{m['dpobs/busy_frac']:>11.3f}"
              f"{busy:>8.3f}{m['dpobs/exposed_frac']:>14.3f}{exposed:>8.3f}")


if __name__ == "__main__":
    main()
