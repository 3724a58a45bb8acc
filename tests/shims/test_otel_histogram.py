"""shims/otel_histogram.py: the op duration recorded straight into the SDK's aggregations holds exactly what
`Histogram.record` would, in every reader, across collections; where that could differ it
falls back to `record`."""
from __future__ import annotations

import random

import pytest
from helpers.sdk import knows_fast_paths
from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader

import dpobs_otel as dpobs
from dpobs_otel import instruments, names
from dpobs_otel.shims.otel_histogram import ClassicRecord


class Memory:
    endpoint = None

    def __init__(self, **kwargs):
        self.reader = InMemoryMetricReader(**kwargs)

    def shutdown(self):
        pass


def _points(exp, name=names.OP_DURATION) -> dict:
    """{op: (count, sum, min, max, classic counts, native buckets)} of one collection."""
    data = exp.reader.get_metrics_data()
    out = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    for p in m.data.data_points:
                        native = getattr(p, "native", None)
                        out[p.attributes["op"]] = (
                            p.count, p.sum, p.min, p.max, tuple(p.bucket_counts),
                            native and native.buckets)
    return out


@pytest.fixture
def pair():
    """Two Telemetries, each with an in-memory reader beside its Prometheus one."""
    tels, exps = [], []
    for role in ("bound", "record"):
        exp = Memory()
        tels.append(dpobs.start(role=role, exporters=[exp]))
        exps.append(exp)
    yield tels, exps
    for t in tels:
        t.shutdown()


def test_bound_and_record_hold_the_same_points_across_collections(pair):
    (bound, plain), (eb, ep) = pair
    rng = random.Random(7)
    for rnd in range(3):  # collections between the rounds: nothing reset, nothing lost
        for _ in range(500):
            op = rng.choice(("put", "get", "clear", "an_adapters_own_op"))
            v = rng.lognormvariate(-6, 1.5) if rng.random() > 0.01 else 0.0
            bound.op_records[op](v)
            plain.op_duration.record(v, {"op": op})
        a, b = _points(eb), _points(ep)
        assert set(a) == {"put", "get", "clear", "an_adapters_own_op"}
        for op in a:
            count, total, lo, hi, classic, native = a[op]
            assert (count, lo, hi, classic, native) == (b[op][0], *b[op][2:]), (rnd, op)
            assert total == pytest.approx(b[op][1], rel=1e-12)
    # every op after its first went the direct way, on an SDK whose internals otel_histogram.py knows
    assert all(bound.op_records[op]._adds for op in a) == knows_fast_paths(bound.op_duration)


def test_a_delta_reader_keeps_the_record_path_and_its_numbers():
    """A delta reader's aggregations are replaced at each collection: no binding."""
    delta = Memory(preferred_temporality={HistogramInstrument: AggregationTemporality.DELTA})
    tel = dpobs.start(role="delta", exporters=[delta])
    try:
        rec = tel.op_records["get"]
        for _ in range(3):
            for v in (0.001, 0.002, 0.003):
                rec(v)
            assert _points(delta)["get"][:2] == (3, pytest.approx(0.006))
        assert rec._adds == ()  # tried once, found unbindable
    finally:
        tel.shutdown()


def test_an_instrumented_client_uses_it(pair):
    (bound, _), (eb, _) = pair
    import torch
    from tensordict import TensorDict
    c = bound.instrument(dpobs.InMemoryDataPlane())
    c.put_samples(["a"], "p", TensorDict({"x": torch.ones(1, 2)}, batch_size=[1]))
    for _ in range(2):
        c.get_samples(["a"], "p")
    assert _points(eb)["get"][0] == 2
    assert bool(bound.op_records["get"]._adds) == knows_fast_paths(bound.op_duration)


def test_a_classic_record_and_record_hold_the_same_points(pair):
    """An explicit-bucket histogram of the SDK's own (Ray's serialization time) through
    ClassicRecord: the points every collection gets are record()'s."""
    (direct, plain), (ed, ep) = pair
    hists = [instruments.create(t.meter, names.RAY_SERIALIZATION) for t in (direct, plain)]
    records = {op: ClassicRecord(hists[0], {"op": op}, names.OP_BUCKETS)
               for op in ("ray_put", "ray_get")}
    rng = random.Random(11)
    for rnd in range(3):
        for size in (1, 7, 300):  # a batch of one, a few, many
            batch = {"ray_put": [], "ray_get": []}
            for _ in range(size):
                op, v = rng.choice(("ray_put", "ray_get")), rng.lognormvariate(-8, 2)
                batch[op].append(v)
                hists[1].record(v, {"op": op})
            for op, values in batch.items():
                if values:
                    records[op].many(values)
        a, b = _points(ed, names.RAY_SERIALIZATION), _points(ep, names.RAY_SERIALIZATION)
        assert set(a) == {"ray_put", "ray_get"}
        for op in a:
            assert a[op][0] == b[op][0] and a[op][2:] == b[op][2:], (rnd, op)
            assert a[op][1] == pytest.approx(b[op][1], rel=1e-12)
    # after its first record each went straight to the SDK's aggregation, where it is known
    assert all(r._aggs for r in records.values()) == knows_fast_paths(hists[0])
