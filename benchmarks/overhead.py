"""Per-op cost of the instrumentation (issue: core, performance).

put+get+clear cycles of two 256-row batches: "jagged", one ~12 MB jagged int64 field; "multi",
that field beside a dense fp32 (256, 1) field, an int64 (256,) field and a non-tensor string.
Each shape through
  (a)  a no-op inner client that answers at once with the prebuilt batch,
  (b)  a naive wrapper over (a) recording four OTel instruments with attribute dicts per op,
       its bytes sized with dpobs's own sizing,
  (b0) the same naive wrapper sizing nothing (its bytes counter gets 0: a first attempt),
  (c)  dpobs's instrumented client over (a),
  (c0) the same with the op duration recorded through the SDK's Histogram.record on every
       op, not shims/otel_histogram.py's direct add (as before issue 20's bound record),
  (d)  the bare InMemoryDataPlane,
interleaved round by round (both shapes in each round) so machine drift hits every arm alike.
Prints per-op microseconds (medians) and the ratios (c-a)/(b-a) (required <= 0.5),
(c-a)/(b0-a) (goal <= 0.5) and (c-a)/d (goal <= 1%), per shape, and P1 of (c0) beside (c):
what the bound record saves.

    .venv/bin/python benchmarks/overhead.py [--rounds 300] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from prometheus_client import CollectorRegistry
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel import names
from dpobs_otel.sizing import payload_nbytes
from progress import Progress  # benchmarks/progress.py: this script's folder

ROWS, TOKENS = 256, 12_000_000 // 8 // 256  # ~12 MB of int64 tokens


def make_batch() -> TensorDict:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(TOKENS // 2, TOKENS * 3 // 2, (ROWS,), generator=g).tolist()
    tok = torch.nested.nested_tensor([torch.randint(0, 50_000, (n,), generator=g)
                                      for n in lengths], layout=torch.jagged)
    return TensorDict({"input_ids": tok}, batch_size=[ROWS])


def make_multi() -> TensorDict:
    """The jagged field beside the small fields a GRPO batch carries."""
    g = torch.Generator().manual_seed(1)
    td = make_batch()
    td["advantages"] = torch.randn(ROWS, 1, generator=g)
    td["step"] = torch.arange(ROWS, dtype=torch.int64)
    td["template"] = "<|im_start|>user {prompt}<|im_end|>"  # one non-tensor string
    return td


SHAPES = {"jagged": make_batch, "multi": make_multi}


class NoOp:
    """Answers at once: whatever is measured over it is the wrapper alone."""

    def __init__(self, batch):
        self.batch = batch

    def put_samples(self, ids, pid, fields=None, tags=None):
        return None

    def get_samples(self, ids, pid, select=None):
        return self.batch

    def clear_samples(self, ids, pid):
        return None

    def list_sample_ids(self, pid):  # occupancy reconciliation lists every 16384 rows put
        return []


class Naive:
    """The obvious wrapper: one SDK record per quantity per op, attribute dicts built inline,
    exported the way a user would (a Prometheus reader and the same bucket View); without a
    reader the SDK would drop every record and the comparison would flatter the naive arm."""

    def __init__(self, inner, size=payload_nbytes):
        self.size = size if size is not None else (lambda _: 0)
        try:
            reader = PrometheusMetricReader(registry=CollectorRegistry())
        except TypeError:  # exporters before 0.63b0 (the declared floor): the global registry
            reader = PrometheusMetricReader()
        view = View(instrument_name="dur",
                    aggregation=ExplicitBucketHistogramAggregation(names.OP_BUCKETS))
        meter = MeterProvider(metric_readers=[reader], views=[view]).get_meter("naive")
        self.inner = inner
        self.dur = meter.create_histogram("dur", unit="s")
        self.bytes = meter.create_counter("bytes", unit="By")
        self.keys = meter.create_counter("keys")
        self.calls = meter.create_counter("calls")

    def _rec(self, op, t0, ids, nbytes, direction):
        self.dur.record(time.perf_counter() - t0, {"op": op})
        self.bytes.add(nbytes, {"op": op, "direction": direction})
        self.keys.add(len(ids) if ids else 0, {"op": op})
        self.calls.add(1, {"op": op})

    def put_samples(self, ids, pid, fields=None, tags=None):
        t0 = time.perf_counter()
        r = self.inner.put_samples(ids, pid, fields, tags)
        self._rec("put", t0, ids, self.size(fields), "write")
        return r

    def get_samples(self, ids, pid, select=None):
        t0 = time.perf_counter()
        r = self.inner.get_samples(ids, pid, select)
        self._rec("get", t0, ids, self.size(r), "read")
        return r

    def clear_samples(self, ids, pid):
        t0 = time.perf_counter()
        r = self.inner.clear_samples(ids, pid)
        self._rec("clear", t0, ids, 0, "write")
        return r


def cycle(client, ids, batch, select) -> float:
    t0 = time.perf_counter()
    client.put_samples(ids, "p", batch)
    client.get_samples(ids, "p", select)
    client.clear_samples(ids, "p")
    return time.perf_counter() - t0


ARMS = [("a", "no-op inner"), ("b", "naive, sizing"), ("b0", "naive, no sizing"),
        ("c", "dpobs instrumented"), ("c0", "dpobs, SDK record()"),
        ("d", "bare InMemoryDataPlane")]


def record_path():
    """A Telemetry whose op duration goes through the SDK's Histogram.record on every op, as
    before shims/otel_histogram.py (native buckets on, as in (c)): what the bound record saves."""
    tel = dpobs.start(role="bench-record")
    for rec in getattr(tel, "op_records", {}).values():  # none in an older checkout
        rec._adds = ()  # as if found unbindable: record() every time
    return tel


def arms(tel, tel0, batch) -> dict:
    return {"a": NoOp(batch), "b": Naive(NoOp(batch)), "b0": Naive(NoOp(batch), size=None),
            "c": tel.instrument(NoOp(batch)), "c0": tel0.instrument(NoOp(batch))}


def run(args, make_arms=arms) -> dict:
    """{shape: {arm: [cycle seconds]}}, every arm of every shape in each round (make_arms:
    another benchmark's arms, e.g. benchmarks/tracing.py's; d, the bare store, is added)."""
    ids = [f"s{i}" for i in range(ROWS)]
    tel, tel0 = dpobs.start(role="bench"), record_path()
    shapes = {}
    for name, make in SHAPES.items():
        batch = make()
        shapes[name] = (batch, list(batch.keys()), make_arms(tel, tel0, batch))
    bare = dpobs.InMemoryDataPlane()
    times = {name: {k: [] for k in (*shapes[name][2], "d")} for name in shapes}
    for _ in range(20):  # warm-up: first SDK records allocate their aggregations
        for batch, select, clients in shapes.values():
            for c in clients.values():
                cycle(c, ids, batch, select)
    progress = Progress(args.rounds)
    for r in range(args.rounds):
        for name, (batch, select, clients) in shapes.items():
            # every other round in reverse: an arm's place in the round costs it ~0.7 us/op
            # (an A/A run of two identical dpobs arms showed it), which would bias c vs c0
            for k, c in (clients.items() if r % 2 else reversed(clients.items())):
                times[name][k].append(cycle(c, ids, batch, select))
            if r % args.bare_every == 0:
                times[name]["d"].append(cycle(bare, ids, batch, select))
        progress(r + 1)  # between rounds, outside every timed cycle
    progress.finish()
    tel.shutdown()
    tel0.shutdown()
    return times


def report(name: str, batch, times: dict, rounds: int) -> dict:
    med = {k: statistics.median(v) * 1e6 / 3 for k, v in times.items()}  # per op
    cost = med["c"] - med["a"]
    print(f"{name}: {ROWS} rows, {payload_nbytes(batch) / 1e6:.1f} MB, fields "
          f"{', '.join(batch.keys())}; {rounds} interleaved rounds")
    for k, label in ARMS:
        print(f"  ({k:<2}) {label:<24} {med[k]:10.1f} us/op")
    print(f"  dpobs cost per op (c-a) = {cost:.1f} us; naive (b-a) = {med['b'] - med['a']:.1f}"
          f" us, without sizing (b0-a) = {med['b0'] - med['a']:.1f} us")
    print(f"  ratio (c-a)/(b-a)  = {cost / (med['b'] - med['a']):.2f}  (required <= 0.5)")
    print(f"  ratio (c0-a)/(b-a) = {(med['c0'] - med['a']) / (med['b'] - med['a']):.2f}  "
          "(P1 through Histogram.record)")
    print(f"  ratio (c-a)/(b0-a) = {cost / (med['b0'] - med['a']):.2f}  (goal <= 0.5)")
    print(f"  ratio (c-a)/d      = {100 * cost / med['d']:.3f}%  (goal <= 1%)")
    return {"cost_us": cost, "p1": cost / (med["b"] - med["a"]),
            "p1_no_sizing": cost / (med["b0"] - med["a"])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--bare-every", type=int, default=10, help="bare-store cycles are slow")
    ap.add_argument("--json", help="also write the ratios per shape here (benchmarks/ab.py)")
    args = ap.parse_args()
    times = run(args)
    ratios = {name: report(name, make(), times[name], args.rounds)
              for name, make in SHAPES.items()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(ratios, f)


if __name__ == "__main__":
    main()
