"""readback/native.py: its decoder against messages the protobuf runtime encodes, its
quantiles against numpy's on the observations, merging across processes and schemas, and a
live endpoint read end to end."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
from google.protobuf.internal.encoder import _VarintBytes
from helpers.protodecode import CLASSES

from dpobs_otel import names
from dpobs_otel.exporters.native_histograms import SCALE
from dpobs_otel.readback import native


def _runtime_stream(**hist) -> bytes:
    """One delimited MetricFamily holding one native histogram, encoded by the runtime."""
    fam = CLASSES["MetricFamily"](name="h_seconds", type=4)
    m = fam.metric.add()
    m.label.add(name="op", value="get")
    for k, v in hist.items():
        if k == "positive_span":
            for offset, length in v:
                m.histogram.positive_span.add(offset=offset, length=length)
        elif k == "positive_delta":
            m.histogram.positive_delta.extend(v)
        else:
            setattr(m.histogram, k, v)
    body = fam.SerializeToString()
    return _VarintBytes(len(body)) + body


def test_decoder_reads_what_the_runtime_writes():
    body = _runtime_stream(sample_count=9, sample_sum=1.5, schema=3, zero_threshold=1e-9,
                           zero_count=1, positive_span=[(-2, 2), (3, 1)],
                           positive_delta=[3, -1, 3])
    [((name, labels), h)] = native.decode(body).items()
    assert name == "h_seconds" and dict(labels) == {"op": "get"}
    assert (h.schema, h.count, h.sum, h.zero_count) == (3, 9, 1.5, 1)
    assert h.buckets == {-2: 3, -1: 2, 3: 5}


def test_classic_histograms_are_not_taken_for_native():
    fam = CLASSES["MetricFamily"](name="c", type=4)
    m = fam.metric.add()
    m.histogram.sample_count = 2
    m.histogram.bucket.add(cumulative_count=2, upper_bound=1.0)
    body = fam.SerializeToString()
    assert native.decode(_VarintBytes(len(body)) + body) == {}


def _hist_of(values, schema=3) -> native.NativeHistogram:
    h = native.NativeHistogram(schema, 1e-9, count=len(values), sum=sum(values))
    for v in values:
        j = math.ceil(math.log2(v) * 2 ** schema)
        h.buckets[j] = h.buckets.get(j, 0) + 1
    return h


def test_quantiles_of_a_merge_are_within_two_percent_of_the_truth():
    rng = random.Random(3)
    parts = [[math.exp(rng.gauss(math.log(m), s)) for _ in range(5000)]
             for m, s in ((0.002, 0.5), (0.006, 0.9), (0.0008, 0.3))]
    pooled = native.merge(_hist_of(p) for p in parts)
    truth = sum(parts, [])
    assert pooled.count == len(truth)
    for q in (0.5, 0.9, 0.99):
        assert pooled.quantile(q) == pytest.approx(np.quantile(truth, q), rel=0.02)


def test_merge_falls_to_the_lowest_schema_exactly():
    values = [0.001 * 1.07 ** k for k in range(60)]
    fine, coarse = _hist_of(values, 4), _hist_of(values, 2)
    assert fine.at_schema(2).buckets == coarse.buckets
    merged = native.merge([fine, coarse])
    assert merged.schema == 2 and merged.buckets == {j: 2 * c for j, c in coarse.buckets.items()}
    with pytest.raises(ValueError):
        coarse.at_schema(3)


def test_empty_and_zero_only():
    assert math.isnan(native.NativeHistogram(3).quantile(0.5))
    h = native.NativeHistogram(3, zero_threshold=1e-9, zero_count=4, count=4)
    assert h.quantile(0.99) <= 1e-9
    assert native.merge([]) is None


def test_fetch_reads_a_live_process(tel):
    rng = random.Random(5)
    values = [math.exp(rng.gauss(math.log(0.003), 0.6)) for _ in range(3000)]
    for v in values:
        tel.op_duration.record(v, tel.op_attrs["get"])
    got = native.fetch(tel.endpoint)
    h = got[(names.OP_DURATION_NATIVE_SERIES, frozenset({("op", "get")}))]
    twice = native.pooled([got, got], names.OP_DURATION_NATIVE_SERIES, op="get")
    assert twice.count == 2 * h.count and twice.buckets == {j: 2 * c for j, c in h.buckets.items()}
    assert native.pooled([got], names.OP_DURATION_NATIVE_SERIES, op="nope") is None
    assert h.count == len(values) and h.sum == pytest.approx(sum(values))
    assert h.schema == SCALE and h.buckets == _hist_of(values, SCALE).buckets
    assert h.quantile(0.9) == pytest.approx(np.quantile(values, 0.9), rel=0.02)


def test_subtract_is_the_window_at_the_lower_schema_or_none_when_it_went_back():
    first = [0.001 * 1.07 ** k for k in range(40)]
    later = [0.002 * 1.05 ** k for k in range(70)]
    prev, now = _hist_of(first, 4), _hist_of(first + later, 4)
    window = native.subtract(now, prev)
    assert window.buckets == _hist_of(later, 4).buckets and window.count == len(later)
    assert window.sum == pytest.approx(sum(later))
    coarse = native.subtract(_hist_of(first + later, 2), prev)  # the process downscaled
    assert coarse.schema == 2 and coarse.buckets == _hist_of(later, 2).buckets
    assert native.subtract(now, None) is now
    assert native.subtract(_hist_of(later, 4), prev) is None  # counts went back: restarted
