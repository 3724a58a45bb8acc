"""The delimited protobuf exposition (io.prometheus.client.MetricFamily), written by hand.

Prometheus asks for it (first) when native histograms are on, and it is the only exposition
Prometheus 2.x reads native histograms from; no Python library writes it, and the protobuf
runtime is not ours to depend on, so this is the few dozen lines of wire format it needs:
varints, zigzag, 64-bit doubles and length-delimited fields, against the field numbers of
prometheus/client_model's metrics.proto (quoted where used). Each MetricFamily message is
preceded by its length as a varint ("encoding=delimited").

Two sources feed it: the prometheus_client families the text exposition renders (so every
family is the same in both), and the native histograms of exporters/native_histograms.py.
"""
from __future__ import annotations

import struct
from collections.abc import Iterable

CONTENT_TYPE = ("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; "
                "encoding=delimited")

# enum MetricType
COUNTER, GAUGE, SUMMARY, UNTYPED, HISTOGRAM = 0, 1, 2, 3, 4
# message Metric: label = 1, gauge = 2, counter = 3, untyped = 5, histogram = 7
_METRIC_FIELD = {COUNTER: 3, GAUGE: 2, UNTYPED: 5, HISTOGRAM: 7}

_VARINT, _I64, _LEN = 0, 1, 2
_DOUBLE = struct.Struct("<d")


# -- wire format ---------------------------------------------------------------------------
def varint(n: int) -> bytes:
    """Base-128 little-endian varint of a non-negative int below 2**64."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def zigzag(n: int) -> int:
    """sint32/sint64's mapping of signed onto unsigned: 0, -1, 1, -2 -> 0, 1, 2, 3."""
    return n << 1 if n >= 0 else (-n << 1) - 1


def _tag(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def uint_field(field: int, n: int) -> bytes:
    return _tag(field, _VARINT) + varint(n)


def sint_field(field: int, n: int) -> bytes:
    return _tag(field, _VARINT) + varint(zigzag(n))


def double_field(field: int, x: float) -> bytes:
    return _tag(field, _I64) + _DOUBLE.pack(x)


def bytes_field(field: int, payload: bytes) -> bytes:
    return _tag(field, _LEN) + varint(len(payload)) + payload


def str_field(field: int, s: str) -> bytes:
    return bytes_field(field, s.encode())


def packed_sints(field: int, values: Iterable[int]) -> bytes:
    return bytes_field(field, b"".join(varint(zigzag(v)) for v in values))


def delimited(message: bytes) -> bytes:
    return varint(len(message)) + message


# -- messages ------------------------------------------------------------------------------
def metric(labels: dict[str, str], kind: int, body: bytes) -> bytes:
    """Metric: LabelPair label = 1 (name = 1, value = 2), then the typed body."""
    pairs = b"".join(bytes_field(1, str_field(1, k) + str_field(2, v))
                     for k, v in sorted(labels.items()))
    return pairs + bytes_field(_METRIC_FIELD[kind], body)


def family(name: str, help_text: str, kind: int, metrics: Iterable[bytes]) -> bytes:
    """One delimited MetricFamily: name = 1, help = 2, type = 3, metric = 4."""
    body = str_field(1, name) + str_field(2, help_text) + uint_field(3, kind)
    return delimited(body + b"".join(bytes_field(4, m) for m in metrics))


def value_body(value: float) -> bytes:
    """Gauge, Counter and Untyped alike: double value = 1 (always written, 0 included)."""
    return double_field(1, value)


def classic_histogram_body(count: int, total: float, buckets: list[tuple[float, int]]) -> bytes:
    """Histogram: sample_count = 1, sample_sum = 2, Bucket bucket = 3 (cumulative_count = 1,
    upper_bound = 2). The +Inf bucket is left out, as client_golang does: it is the count,
    and Prometheus adds it."""
    out = uint_field(1, count) + double_field(2, total)
    for bound, cumulative in buckets:
        if bound != float("inf"):
            out += bytes_field(3, uint_field(1, cumulative) + double_field(2, bound))
    return out


def native_histogram_body(count: int, total: float, schema: int, zero_threshold: float,
                          zero_count: int, positive: list[tuple[int, list[int]]],
                          negative: list[tuple[int, list[int]]] = ()) -> bytes:
    """Histogram's native fields: schema = 5 (sint32), zero_threshold = 6, zero_count = 7,
    negative_span = 9 / negative_delta = 10, positive_span = 12 / positive_delta = 13. Spans
    are (index of the first bucket, counts), in Prometheus's indexing, ascending."""
    out = (uint_field(1, count) + double_field(2, total) + sint_field(5, schema)
           + double_field(6, zero_threshold) + uint_field(7, zero_count))
    return out + _spans(9, 10, negative) + _spans(12, 13, positive)


def _spans(span_field: int, delta_field: int, spans: list[tuple[int, list[int]]]) -> bytes:
    """BucketSpan (offset = 1 sint32: the gap after the previous span, or the first index;
    length = 2) and the deltas of every bucket from the one before it (the first from 0)."""
    out, deltas, previous_end, previous_count = b"", [], 0, 0
    for first, counts in spans:
        out += bytes_field(span_field, sint_field(1, first - previous_end)
                           + uint_field(2, len(counts)))
        previous_end = first + len(counts)
        for c in counts:
            deltas.append(c - previous_count)
            previous_count = c
    return out + (packed_sints(delta_field, deltas) if deltas else b"")


# -- prometheus_client families ------------------------------------------------------------
def from_prometheus_client(families: Iterable) -> bytes:
    """The families a CollectorRegistry collects, as the text exposition names them: a
    counter is `<name>_total` (prometheus_client strips the suffix from the family and puts
    it back on the sample; its `_created` samples are left out, as in the text format), an
    info family is the gauge `<name>_info`."""
    return b"".join(_family_of(f) for f in families)


def _family_of(f) -> bytes:
    if f.type == "counter":
        samples = [s for s in f.samples if s.name == f.name + "_total"]
        return family(f.name + "_total", f.documentation, COUNTER,
                      [metric(s.labels, COUNTER, value_body(s.value)) for s in samples])
    if f.type in ("gauge", "info", "unknown", "untyped"):
        kind = GAUGE if f.type in ("gauge", "info") else UNTYPED
        name = f.name + "_info" if f.type == "info" else f.name
        return family(name, f.documentation, kind,
                      [metric(s.labels, kind, value_body(s.value)) for s in f.samples])
    if f.type == "histogram":
        return family(f.name, f.documentation, HISTOGRAM, _classic_metrics(f))
    raise ValueError(f"dpobs: no protobuf encoding for a {f.type} family ({f.name})")


def _classic_metrics(f) -> list[bytes]:
    """Regroup a histogram family's flat _bucket/_count/_sum samples per label set."""
    series: dict[tuple, dict] = {}
    for s in f.samples:
        labels = {k: v for k, v in s.labels.items() if k != "le"}
        h = series.setdefault(tuple(sorted(labels.items())),
                              {"labels": labels, "buckets": [], "count": 0, "sum": 0.0})
        suffix = s.name[len(f.name):]
        if suffix == "_bucket":
            h["buckets"].append((float(s.labels["le"]), int(s.value)))
        elif suffix == "_count":
            h["count"] = int(s.value)
        elif suffix == "_sum":
            h["sum"] = s.value
    return [metric(h["labels"], HISTOGRAM,
                   classic_histogram_body(h["count"], h["sum"], sorted(h["buckets"])))
            for h in series.values()]


# -- content negotiation -------------------------------------------------------------------
def wants_protobuf(accept: str | None) -> bool:
    """True when the Accept header ranks the delimited MetricFamily protobuf at least as high
    as anything else it offers (Prometheus with native histograms on puts it first)."""
    best_other, proto_q = 0.0, None
    for part in (accept or "").split(","):
        fields = [p.strip() for p in part.split(";")]
        params = dict(p.split("=", 1) for p in fields[1:] if "=" in p)
        try:
            q = float(params.get("q", "1"))
        except ValueError:
            q = 0.0
        if (fields[0] == "application/vnd.google.protobuf"
                and params.get("proto") == "io.prometheus.client.MetricFamily"
                and params.get("encoding") == "delimited"):
            proto_q = max(q, proto_q or 0.0)
        elif fields[0]:
            best_other = max(best_other, q)
    return proto_q is not None and proto_q > 0 and proto_q >= best_other
