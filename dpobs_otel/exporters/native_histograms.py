"""Native histograms: the op duration's buckets at one pinned exponential schema, kept beside
its classic explicit buckets by the same aggregation, and written as a Prometheus native
histogram in the protobuf exposition.

Why not a second, exponential-bucket View: a second View on the op duration (any kind: the
SDK's per-stream attribute handling is most of it; its exponential aggregation adds to that)
cost more per op than the rest of dpobs's record (docs/native-histograms.md, "How a process
serves it, and what it costs", has the figure and its command). So the one View
the op duration already has gets an aggregation that is the SDK's explicit-bucket one plus a
bucket index and a dict increment per record; its data points carry the native buckets to our
reader (NativeReader), which takes them out for the protobuf exposition and passes the classic
histogram on, unchanged, to the OpenTelemetry Prometheus exporter (which never sees anything
it cannot render) and to any push exporter (OTLP gets the classic histogram).

Schema 4: neighbouring bounds 2**(1/16) apart, 53 buckets per decade, worst-case relative
error inside a bucket 4.4% (quantiles interpolate inside it, and even a sparse tail's stays
inside one bucket). Schema 3 (27 per decade, 9.05%) put the demo's p99s too close to the 5%
this must hold; schema 5 doubles the buckets again for error the interpolation already hides
(the demo's figures: docs/native-histograms.md). The cost is the buckets that hold
observations: an op spanning one decade has ~53, in one series per process (a few bytes each
in the protobuf exposition, where the classic histogram takes 18 series per op); 1 us..100 s
at most 426. The schema is a constant, not an SDK scale that can fall: a sum across
processes falls to the lowest schema among them, so every process must use the same one.

Prometheus's bucket j at schema s is (2**((j-1)/2**s), 2**(j/2**s)] (OpenTelemetry's index
is j - 1 for the same bucket). A duration of exactly 0 (a coarse clock) goes to the zero
bucket, whose threshold is above 0 (Prometheus 2.42 takes a family as native only when its
first metric says so) and below any real duration.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, fields

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics.export import (AggregationTemporality, HistogramDataPoint,
                                              Metric, MetricsData)

from .. import names
from ..shims import otel_sdk
from . import protobuf

SCALE = 4
ZERO_THRESHOLD = 2.0 ** -128
CUMULATIVE = AggregationTemporality.CUMULATIVE


@dataclass(frozen=True)
class Native:
    """A native histogram's cumulative state: counts by Prometheus bucket index."""
    count: int
    sum: float
    zero_count: int
    buckets: tuple[tuple[int, int], ...]  # (j, count), ascending j, no zeros


@dataclass(frozen=True)
class NativeHistogramDataPoint(HistogramDataPoint):
    """The SDK's classic point, with the native histogram of the same observations."""
    native: Native | None = None


def with_native(point: HistogramDataPoint, counts: dict) -> NativeHistogramDataPoint:
    """The classic point with the native buckets `counts` ({j: count}, None: the zero
    bucket) beside it; their sum is the point's (otel_sdk's aggregation keeps one)."""
    zero = counts.pop(None, 0)
    native = Native(zero + sum(counts.values()), point.sum, zero, tuple(sorted(counts.items())))
    return NativeHistogramDataPoint(
        **{f.name: getattr(point, f.name) for f in fields(HistogramDataPoint)}, native=native)


class NativeReader(PrometheusMetricReader):
    """A PrometheusMetricReader that also keeps each collection's native histograms for the
    protobuf exposition: one collect feeds both expositions, so they show one instant. (Its
    one override is the SDK's private hook, named in otel_sdk.OWNED; an exporter without
    it never calls this, and the native families are absent.)"""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._native_lock = threading.Lock()
        self._native: list[tuple[str, str, list]] = []  # (family, help, data points)
        self.collected = None  # see watch()

    @classmethod
    def on(cls, registry) -> tuple["NativeReader", object]:
        """(a reader on `registry`, the registry that serves it: otel_sdk.prometheus_reader)."""
        return otel_sdk.prometheus_reader(cls, registry)

    def _receive_metrics(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                         **kwargs) -> None:
        if metrics_data is not None:
            native = [(_name(m), m.description or "", m.data.data_points)
                      for rm in metrics_data.resource_metrics for sm in rm.scope_metrics
                      for m in sm.metrics if _has_native(m)]
            with self._native_lock:
                self._native = native
            if self.collected is not None:
                self.collected(metrics_data)
        super()._receive_metrics(metrics_data, timeout_millis, **kwargs)

    def watch(self, collected) -> bool:
        """collected(metrics_data) after each collection (the Telemetry's look for the SDK's
        overflow points; it must not raise). Only through the exporter's private hook
        (otel_sdk.OWNED): without it the overflow goes uncounted, logged and counted once as
        a degradation. True when watched."""
        if otel_sdk.owned("receive_metrics") is None:
            otel_sdk.degrade("the cardinality overflow count", "no _receive_metrics hook")
            return False
        self.collected = collected
        return True

    def native_families(self, wanted: list[str] | None = None) -> bytes:
        """The latest collection's native histograms as families (only those named in
        `wanted`, when given)."""
        with self._native_lock:
            native = list(self._native)
        return b"".join(encode(name, help_text, points) for name, help_text, points in native
                        if not wanted or name in wanted)

    def shutdown(self, *args, **kwargs):
        if otel_sdk.release_reader(self):  # an old exporter's, on a registry of our own
            return None
        return super().shutdown(*args, **kwargs)


def _has_native(m: Metric) -> bool:
    points = getattr(m.data, "data_points", ())
    return bool(points) and getattr(points[0], "native", None) is not None


def _name(m: Metric) -> str:
    """The native family of a metric: its name with `.native` (names.OP_DURATION_NATIVE)."""
    return names.series(f"{m.name}.native", m.unit or "")


def encode(name: str, help_text: str, points) -> bytes:
    """Data points carrying native histograms as one delimited MetricFamily."""
    body = [protobuf.metric({otel_sdk.sanitize_attribute(k): str(v) for k, v in p.attributes.items()},
                            protobuf.HISTOGRAM, _native_body(p.native))
            for p in points if p.native is not None]
    return protobuf.family(name, help_text, protobuf.HISTOGRAM, body)


def _native_body(n: Native) -> bytes:
    return protobuf.native_histogram_body(n.count, n.sum, SCALE, ZERO_THRESHOLD, n.zero_count,
                                          spans(n.buckets))


def spans(buckets) -> list[tuple[int, list[int]]]:
    """(j, count) pairs, ascending j, as runs of adjacent buckets: [(first j, counts)]."""
    out: list[tuple[int, list[int]]] = []
    for j, c in buckets:
        if out and out[-1][0] + len(out[-1][1]) == j:
            out[-1][1].append(c)
        else:
            out.append((j, [c]))
    return out
