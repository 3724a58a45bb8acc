"""The protobuf exposition: our wire format against the protobuf runtime's decoder, every family
of the text exposition present with the same values, the native histogram's buckets against
indexes computed here from the observations, and the Accept negotiation."""
from __future__ import annotations

import math
import random
import urllib.request

import pytest
from google.protobuf.internal.encoder import _VarintBytes
from helpers.protodecode import TYPES, decode, labels, native_buckets
from helpers.workload import exercised_process
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import dpobs_otel as dpobs
from dpobs_otel import names
from dpobs_otel.exporters import native_histograms, protobuf
from dpobs_otel.shims import otel_sdk

ACCEPT_2_42 = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
               "encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


@pytest.mark.parametrize("n", [0, 1, 127, 128, 300, 2**32 - 1, 2**63, 2**64 - 1])
def test_varint_matches_the_runtime(n):
    assert protobuf.varint(n) == _VarintBytes(n)


def test_zigzag():
    assert [protobuf.zigzag(n) for n in (0, -1, 1, -2, 2, -64)] == [0, 1, 2, 3, 4, 127]


@pytest.mark.parametrize("accept,expected", [
    (ACCEPT_2_42, True),
    ("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
     "encoding=delimited", True),
    ("text/plain;version=0.0.4;q=1,application/vnd.google.protobuf;"
     "proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5", False),
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=text", False),  # the text protobuf encoding is not ours
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
     "encoding=delimited;q=0", False),
    ("application/openmetrics-text;version=1.0.0", False), ("", False), (None, False)])
def test_negotiation(accept, expected):
    assert protobuf.wants_protobuf(accept) is expected


def _text_families(exporter) -> dict:
    return {f.name: f for f in text_string_to_metric_families(
        generate_latest(exporter.registry).decode())}


def _expected_name(f) -> str:
    return f.name + "_total" if f.type == "counter" else f.name


def _values(f) -> dict:
    """{(sample name, labels): value} of a text family; histograms with their +Inf bucket."""
    return {(s.name, frozenset(s.labels.items())): s.value for s in f.samples
            if not s.name.endswith("_created")}


def _proto_values(pf, text_name: str) -> dict:
    """The same shape from a decoded protobuf family (the +Inf bucket is the count)."""
    out = {}
    kind = TYPES[pf.type]
    for m in pf.metric:
        lab = labels(m)
        if kind == "HISTOGRAM":
            h = m.histogram
            for b in h.bucket:
                le = {**lab, "le": _le(b.upper_bound)}
                out[(text_name + "_bucket", frozenset(le.items()))] = b.cumulative_count
            out[(text_name + "_bucket", frozenset({**lab, "le": "+Inf"}.items()))] = \
                h.sample_count
            out[(text_name + "_count", frozenset(lab.items()))] = h.sample_count
            out[(text_name + "_sum", frozenset(lab.items()))] = h.sample_sum
        else:
            value = getattr(m, kind.lower()).value
            out[(pf.name, frozenset(lab.items()))] = value
    return out


def _le(bound: float) -> str:
    return repr(float(bound))


@pytest.fixture
def exercised():
    with exercised_process("proto") as tel:
        yield tel


def test_every_text_family_is_in_the_protobuf_with_the_same_values(exercised):
    exporter = exercised.exporters[0]
    text = _text_families(exporter)  # nothing runs between the two renders: same values
    proto = {f.name: f for f in decode(exporter.render_protobuf())}
    kinds = {"counter": "COUNTER", "gauge": "GAUGE", "histogram": "HISTOGRAM"}
    assert {f.type for f in text.values()} == set(kinds)  # every kind is exercised
    assert text["target_info"].type == "gauge"  # an info family: a gauge in both
    for f in text.values():
        pf = proto.pop(_expected_name(f))
        assert TYPES[pf.type] == kinds[f.type], f.name
        assert pf.help == f.documentation
        assert _proto_values(pf, f.name) == _values(f), f.name
    # What is left is only the native family, absent from the text exposition.
    assert set(proto) == {names.OP_DURATION_NATIVE_SERIES}
    assert names.OP_DURATION_NATIVE_SERIES not in generate_latest(exporter.registry).decode()


def test_counters_carry_total_as_prometheus_expects(exercised):
    proto = {f.name: f for f in decode(exercised.exporters[0].render_protobuf())}
    for series in (names.TRANSFERRED_SERIES, names.KEYS_SERIES, names.INSTR_TIME_SERIES):
        assert TYPES[proto[series].type] == "COUNTER"
    assert TYPES[proto["target_info"].type] == "GAUGE"


def _index(v: float) -> int:
    """Prometheus's bucket j at schema s holds (2**((j-1)/2**s), 2**(j/2**s)]."""
    return math.ceil(math.log2(v) * 2 ** native_histograms.SCALE)


def test_native_histogram_buckets_hold_each_observation(tel):
    rng = random.Random(7)
    values = [math.exp(rng.gauss(math.log(0.004), 1.5)) for _ in range(2000)]
    values = [v for v in values  # one ulp from a boundary, log2 cannot say which side
              if abs(math.log2(v) * 2 ** native_histograms.SCALE
                     - round(math.log2(v) * 2 ** native_histograms.SCALE)) > 1e-9]
    for v in values:
        tel.op_duration.record(v, tel.op_attrs["get"])
    tel.op_duration.record(0.0, tel.op_attrs["get"])  # a coarse clock's zero
    [fam] = [f for f in decode(tel.exporters[0].render_protobuf())
             if f.name == names.OP_DURATION_NATIVE_SERIES]
    [m] = [m for m in fam.metric if labels(m) == {"op": "get"}]
    h = m.histogram
    assert TYPES[fam.type] == "HISTOGRAM" and h.schema == native_histograms.SCALE
    assert h.zero_threshold > 0 and h.zero_count == 1 and not h.bucket
    assert h.sample_count == len(values) + 1
    assert h.sample_sum == pytest.approx(sum(values), rel=1e-9)
    truth: dict[int, int] = {}
    for v in values:
        truth[_index(v)] = truth.get(_index(v), 0) + 1
    assert native_buckets(h) == truth
    assert not h.negative_span and not h.negative_delta


def test_wide_range_stays_at_the_pinned_schema(tel):
    for v in (1e-9, 1e-6, 1e-3, 1.0, 100.0, 1e4):  # 1 ns .. 3 h in one series
        tel.op_duration.record(v, tel.op_attrs["put"])
    [fam] = [f for f in decode(tel.exporters[0].render_protobuf())
             if f.name == names.OP_DURATION_NATIVE_SERIES]
    [m] = [m for m in fam.metric if labels(m) == {"op": "put"}]
    assert m.histogram.schema == native_histograms.SCALE
    assert sorted(native_buckets(m.histogram)) == sorted(
        _index(v) for v in (1e-9, 1e-6, 1e-3, 1.0, 100.0, 1e4))


def test_spans_are_runs_of_adjacent_buckets():
    assert native_histograms.spans(((-2, 1), (1, 2), (2, 3), (7, 1))) == [(-2, [1]), (1, [2, 3]), (7, [1])]
    assert native_histograms.spans(()) == []


def test_served_by_accept_header(tel):
    for v in (0.001, 0.002):
        tel.op_duration.record(v, tel.op_attrs["get"])
    req = urllib.request.Request(tel.url, headers={"Accept": ACCEPT_2_42})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"] == protobuf.CONTENT_TYPE
        fams = {f.name for f in decode(r.read())}
    assert names.OP_DURATION_NATIVE_SERIES in fams and "target_info" in fams
    text = urllib.request.urlopen(tel.url, timeout=10).read().decode()
    assert "dpobs_client_operation_duration_seconds_bucket" in text
    assert names.OP_DURATION_NATIVE_SERIES not in text


def test_a_push_reader_gets_the_classic_histogram_unchanged():
    from opentelemetry.sdk.metrics.export import Histogram, InMemoryMetricReader

    class Memory:
        endpoint = None

        def __init__(self):
            self.reader = InMemoryMetricReader()

        def shutdown(self):
            pass
    exp = Memory()
    tel = dpobs.start(role="push", exporters=[exp])
    try:
        tel.op_duration.record(0.01, tel.op_attrs["get"])
        data = exp.reader.get_metrics_data()
        seen = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics}
        assert names.OP_DURATION_NATIVE not in seen  # no second stream: one per instrument
        assert isinstance(seen[names.OP_DURATION].data, Histogram)
        [p] = seen[names.OP_DURATION].data.data_points
        assert p.count == 1 and tuple(p.explicit_bounds) == names.OP_BUCKETS
    finally:
        tel.shutdown()


@pytest.mark.parametrize("temporality", ["CUMULATIVE", "DELTA"])
def test_the_classic_half_is_the_sdks_explicit_bucket_histogram(temporality):
    """otel_sdk.OpDurationAggregation redoes the SDK's classic update under its lock: its points
    must equal the SDK's own aggregation's, record for record, in either temporality (this
    fails first if an SDK upgrade changes the fields it relies on)."""
    from opentelemetry.sdk.metrics import Histogram, MeterProvider
    from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    def points(aggregation):
        reader = InMemoryMetricReader(preferred_temporality={
            Histogram: getattr(AggregationTemporality, temporality)})
        provider = MeterProvider(metric_readers=[reader], views=[
            View(instrument_name="d", aggregation=aggregation)])
        h = provider.get_meter("m").create_histogram("d", unit="s")
        rng, out = random.Random(9), []
        for _ in range(3):  # three collections: the delta/cumulative bookkeeping too
            for _ in range(500):
                h.record(rng.choice([0.0, rng.lognormvariate(-6, 2)]), {"op": "get"})
            [p] = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics[
                0].data.data_points
            out.append({k: v for k, v in vars(p).items() if k not in ("time_unix_nano",
                                                                       "start_time_unix_nano",
                                                                       "native")})
        provider.shutdown()
        return out
    assert points(otel_sdk.op_duration_aggregation(names.OP_BUCKETS, native_histograms.SCALE,
                                                   native_histograms.with_native)) == \
        points(ExplicitBucketHistogramAggregation(boundaries=names.OP_BUCKETS))
