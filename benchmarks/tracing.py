"""What tracing costs (issue 24): per op with tracing on against off, and the ring's memory.
(Tracing off against another checkout, P1 A/B: benchmarks/ab.py.)

Arms, interleaved round by round over overhead.py's no-op inner client and batches:
  (a)    the no-op inner client alone
  (b)    overhead.py's naive wrapper (the denominator of its P1 ratio)
  (off)  dpobs's instrumented client, tracing off
  (on)   dpobs's instrumented client, tracing on (every op kept in the ring)
The cost per op of tracing is on - off (goal <= 10 us); P1 = (c-a)/(b-a) of both arms. Then
Tracer.op alone, and the ring: bytes per op span by tracemalloc, in a full ring.

    PYTHONPATH=. .venv/bin/python benchmarks/tracing.py [--rounds 300]
"""
from __future__ import annotations

import argparse
import statistics
import tracemalloc
from time import perf_counter

import dpobs_otel as dpobs
from dpobs_otel.tracing import Tracer
import overhead  # benchmarks/overhead.py
from overhead import SHAPES, Naive, NoOp

ARMS = ("a", "b", "off", "on")


def run(args) -> dict:
    """overhead.py's interleaved rounds over this benchmark's arms."""
    on = dpobs.start(role="bench-on", trace=True)

    def arms(off, *rest):  # overhead.arms's signature: (tel, [other telemetries], batch)
        batch = rest[-1]
        return {"a": NoOp(batch), "b": Naive(NoOp(batch)), "off": off.instrument(NoOp(batch)),
                "on": on.instrument(NoOp(batch))}
    try:
        return overhead.run(args, arms)
    finally:
        on.shutdown()


def report(name: str, times: dict) -> None:
    med = {k: statistics.median(v) * 1e6 / 3 for k, v in times.items() if k in ARMS}
    p1 = {k: (med[k] - med["a"]) / (med["b"] - med["a"]) for k in ("off", "on")}
    print(f"{name}: " + ", ".join(f"({k}) {med[k]:.1f}" for k in ARMS) + " us/op")
    print(f"  P1 (c-a)/(b-a): tracing off {p1['off']:.3f}, on {p1['on']:.3f}")
    print(f"  tracing on costs {med['on'] - med['off']:.2f} us/op (goal <= 10)")


def hook_cost(n: int = 200_000) -> float:
    """The ring's hot path alone: Tracer.op per call, in us."""
    tr = Tracer(16384, 1)
    t = perf_counter()
    for _ in range(n):
        tr.op("get", t, t, "grpo", 256, 12_000_000)
    return (perf_counter() - t) / n * 1e6


def ring_bytes(size: int = 16384) -> float:
    """Bytes per kept op span in a full ring (records, their floats and ints)."""
    tracemalloc.start()
    tr = Tracer(size, 1)
    for i in range(size):
        t = perf_counter()
        tr.op("get", t, perf_counter(), "grpo", 256 + i, 12_000_000 + i)
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return used / size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--bare-every", type=int, default=10, help="bare-store cycles are slow")
    args = ap.parse_args()
    times = run(args)
    for name in SHAPES:
        report(name, times[name])
    print(f"Tracer.op alone: {hook_cost():.2f} us/op")
    per = ring_bytes()
    print(f"ring: {per:.0f} bytes per op span; the default 16384 spans: "
          f"{per * 16384 / 2**20:.1f} MiB per process")


if __name__ == "__main__":
    main()
