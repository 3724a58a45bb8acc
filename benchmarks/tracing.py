"""What tracing costs (issue 24): per op with tracing off against the base branch's client (A/B
in one run), per op with tracing on, and the ring's memory.

The base's client (`git show BASE:dpobs_otel/client.py`, default main) is loaded beside this
tree's as a module of the same package, so both run over the same Telemetry in one process.
Arms, interleaved round by round over overhead.py's no-op inner client and batches:
  (a)    the no-op inner client alone
  (b)    overhead.py's naive wrapper (the denominator of its P1 ratio)
  (base) the base branch's instrumented client
  (off)  this tree's instrumented client, tracing off
  (on)   this tree's instrumented client, tracing on (every op kept in the ring)
P1 = (c-a)/(b-a) for base and off (required: off no more than 0.02 above base); the cost per
op of tracing is on - off (goal <= 10 us). The ring: bytes per span by tracemalloc, full ring.

    PYTHONPATH=. .venv/bin/python benchmarks/tracing.py [--rounds 200] [--base main]
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import tracemalloc
from time import perf_counter

import dpobs_otel as dpobs
from dpobs_otel.tracing import Tracer
from overhead import ROWS, SHAPES, Naive, NoOp, cycle  # benchmarks/overhead.py
from progress import Progress

ARMS = ("a", "b", "base", "off", "on")


def base_client(ref: str):
    """The InstrumentedClient class of `ref`'s client.py, as dpobs_otel._base_client."""
    source = subprocess.run(["git", "show", f"{ref}:dpobs_otel/client.py"], check=True,
                            capture_output=True, text=True).stdout
    spec = importlib.util.spec_from_loader("dpobs_otel._base_client", loader=None)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = "dpobs_otel"
    exec(compile(source, f"{ref}:dpobs_otel/client.py", "exec"), module.__dict__)
    return module.InstrumentedClient


def run(args) -> dict:
    ids = [f"s{i}" for i in range(ROWS)]
    off = dpobs.start(role="bench-off", trace=False)
    on = dpobs.start(role="bench-on", trace=True)
    base = base_client(args.base)
    shapes = {}
    for name, make in SHAPES.items():
        batch = make()
        shapes[name] = (batch, list(batch.keys()), {
            "a": NoOp(batch), "b": Naive(NoOp(batch)), "base": base(NoOp(batch), off),
            "off": off.instrument(NoOp(batch)), "on": on.instrument(NoOp(batch))})
    times = {name: {k: [] for k in ARMS} for name in shapes}
    for _ in range(20):
        for batch, select, clients in shapes.values():
            for c in clients.values():
                cycle(c, ids, batch, select)
    progress = Progress(args.rounds)
    for r in range(args.rounds):
        for name, (batch, select, clients) in shapes.items():
            for k, c in clients.items():
                times[name][k].append(cycle(c, ids, batch, select))
        progress(r + 1)
    progress.finish()
    off.shutdown()
    on.shutdown()
    return times


def report(name: str, times: dict) -> None:
    med = {k: statistics.median(v) * 1e6 / 3 for k, v in times.items()}  # per op
    p1 = {k: (med[k] - med["a"]) / (med["b"] - med["a"]) for k in ("base", "off")}
    print(f"{name}: " + ", ".join(f"({k}) {med[k]:.1f}" for k in ARMS) + " us/op")
    print(f"  P1 (c-a)/(b-a): base {p1['base']:.3f}, tracing off {p1['off']:.3f}, "
          f"difference {p1['off'] - p1['base']:+.3f} (required <= +0.02)")
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
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--base", default="main", help="the git ref whose client is the A arm")
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
