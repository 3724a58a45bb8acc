"""Native histograms read straight from a process's protobuf exposition, merged across
processes and asked for quantiles the way Prometheus 2.x's histogram_quantile() answers them
(linear interpolation inside a bucket), for readers without a Prometheus (the demo's report).

    hists = native.fetch("127.0.0.1:9464")          # {(family, labels): NativeHistogram}
    pooled = native.merge(h for (name, labels), h in hists.items() if ...)
    pooled.quantile(0.99)

The decoder reads only what it needs of io.prometheus.client.MetricFamily (name = 1,
metric = 4; Metric.label = 1, Metric.histogram = 7; Histogram's sample_count = 1,
sample_sum = 2, schema = 5, zero_threshold = 6, zero_count = 7, positive_span = 12,
positive_delta = 13) and skips everything else by wire type, so families without native
histograms pass through unread. Durations are never negative: negative buckets are not read.
"""
from __future__ import annotations

import http.client
import math
import ssl
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

ACCEPT = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
          "encoding=delimited")


class HTTPStatusError(OSError):
    """An endpoint answered, with a status other than 200 (scrape.ScrapeError)."""


@dataclass
class NativeHistogram:
    schema: int
    zero_threshold: float = 0.0
    zero_count: float = 0.0
    count: float = 0.0
    sum: float = 0.0
    buckets: dict[int, float] = field(default_factory=dict)  # Prometheus index j -> count

    def bounds(self, j: int) -> tuple[float, float]:
        """Bucket j holds (2**((j-1)/2**schema), 2**(j/2**schema)]."""
        step = 2.0 ** -self.schema
        return 2.0 ** ((j - 1) * step), 2.0 ** (j * step)

    def at_schema(self, schema: int) -> "NativeHistogram":
        """The same observations at a lower schema: bucket j goes to ceil(j / 2**d)."""
        d = self.schema - schema
        if d < 0:
            raise ValueError("a histogram cannot be upscaled")
        out = NativeHistogram(schema, self.zero_threshold, self.zero_count, self.count,
                              self.sum)
        for j, c in self.buckets.items():
            k = -((-j) >> d)  # ceil(j / 2**d) for either sign
            out.buckets[k] = out.buckets.get(k, 0.0) + c
        return out

    def quantile(self, q: float) -> float:
        """histogram_quantile(q, ...) of Prometheus 2.x: the zero bucket [0, threshold]
        first, then each bucket in turn, interpolating linearly inside the one that holds
        the rank. NaN without observations."""
        if self.count <= 0:
            return math.nan
        rank, seen = q * self.count, self.zero_count
        if rank <= seen:
            return self.zero_threshold * (rank / seen if seen else 0.0)
        upper = self.zero_threshold
        for j in sorted(self.buckets):
            c = self.buckets[j]
            lower, upper = self.bounds(j)
            if c and seen + c >= rank:
                return lower + (upper - lower) * (rank - seen) / c
            seen += c
        return upper


def merge(hists: Iterable[NativeHistogram]) -> NativeHistogram | None:
    """The sum of several processes' histograms, at the lowest schema among them (as
    Prometheus's sum() does); None for none."""
    hists = list(hists)
    if not hists:
        return None
    schema = min(h.schema for h in hists)
    out = NativeHistogram(schema, max(h.zero_threshold for h in hists))
    for h in hists:
        h = h.at_schema(schema)
        out.count += h.count
        out.sum += h.sum
        out.zero_count += h.zero_count
        for j, c in h.buckets.items():
            out.buckets[j] = out.buckets.get(j, 0.0) + c
    return out


def pooled(per_process: Iterable[dict], family: str, **labels: str) -> NativeHistogram | None:
    """One series (family and exact labels) of several processes' fetch() answers, merged;
    None when no process serves it."""
    want = (family, frozenset(labels.items()))
    return merge(h[want] for h in per_process if want in h)


def subtract(now: NativeHistogram, prev: NativeHistogram | None) -> NativeHistogram | None:
    """now - prev, bucket by bucket at the lower of their schemas: what one process observed
    between two reads of its cumulative histogram. prev None means since start. None when
    any count went back (the process restarted: the caller takes now in full)."""
    if prev is None:
        return now
    schema = min(now.schema, prev.schema)
    a, b = now.at_schema(schema), prev.at_schema(schema)
    out = NativeHistogram(schema, a.zero_threshold, a.zero_count - b.zero_count,
                          a.count - b.count, a.sum - b.sum)
    for j in set(a.buckets) | set(b.buckets):
        c = a.buckets.get(j, 0.0) - b.buckets.get(j, 0.0)
        if c < 0:
            return None
        if c:
            out.buckets[j] = c
    if out.count < 0 or out.zero_count < 0 or a.zero_threshold != b.zero_threshold:
        return None
    return out


def by_label(hists: dict, family: str, label: str) -> dict[str, NativeHistogram]:
    """One family of a fetch() answer per value of one label (series that differ in other
    labels merged): e.g. the op-duration histograms by op."""
    groups: dict[str, list[NativeHistogram]] = {}
    for (name, labels), h in hists.items():
        if name == family:
            groups.setdefault(dict(labels).get(label, ""), []).append(h)
    return {k: merge(v) for k, v in groups.items()}


# -- wire format ---------------------------------------------------------------------------
DOUBLE = struct.Struct("<d").unpack_from


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def fields(buf: bytes):
    """(field number, wire type, value) of one message: ints for varints, bytes for
    length-delimited fields, floats for 64-bit ones (doubles, the only ones here). Keys and
    varints of one byte (nearly all of them here) skip _varint: this walk is most of a
    body's decoding time."""
    pos, end = 0, len(buf)
    while pos < end:
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = _varint(buf, pos)
        wire = key & 7
        if wire == 0:
            value = buf[pos]
            if value < 0x80:
                pos += 1
            else:
                value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = DOUBLE(buf, pos)[0], pos + 8
        elif wire == 2:
            size = buf[pos]
            if size < 0x80:
                pos += 1
            else:
                size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield key >> 3, wire, value


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _sints(wire: int, value) -> list[int]:
    """A repeated sint field's values, packed (one LEN field) or not (one varint each)."""
    if wire == 0:
        return [_unzigzag(value)]
    out, pos = [], 0
    while pos < len(value):
        v, pos = _varint(value, pos)
        out.append(_unzigzag(v))
    return out


def histogram(buf: bytes) -> tuple[NativeHistogram, list[tuple[float, float]], bool]:
    """One Histogram message: (its count, sum and native buckets; its classic buckets
    (upper_bound = 2, cumulative_count = 1 of Bucket = 3); whether it is native). One walk
    serves both readers (decode here, the sample decoder of protobody.py)."""
    h = NativeHistogram(schema=0)
    spans, deltas, native, classic = [], [], False, []
    for number, wire, value in fields(buf):
        if number == 1:
            h.count = float(value)
        elif number == 2:
            h.sum = value
        elif number == 3:
            classic.append(_bucket(value))
        elif number == 5:
            h.schema, native = _unzigzag(value), True
        elif number == 6:
            h.zero_threshold, native = value, native or value > 0
        elif number == 7:
            h.zero_count = float(value)
        elif number == 12:
            span = dict((n, v) for n, _, v in fields(value))
            spans.append((_unzigzag(span.get(1, 0)), span.get(2, 0)))
            native = True
        elif number == 13:
            deltas += _sints(wire, value)
    if not native:
        return h, classic, False
    index, count, it = 0, 0, iter(deltas)
    for offset, length in spans:
        index += offset
        for _ in range(length):
            count += next(it)
            h.buckets[index] = float(count)
            index += 1
    return h, classic, True


def _bucket(b: bytes) -> tuple[float, float]:
    """Bucket: (upper_bound = 2, cumulative_count = 1, or cumulative_count_float = 4). The
    layout our encoder and client_golang write (a count tag 0x08 and its varint, a bound tag
    0x11 and its double) is read without the generic walk, a third of a body's fields."""
    if b[:1] == b"\x08":
        count, pos = _varint(b, 1)
        if len(b) == pos + 9 and b[pos] == 0x11:
            return DOUBLE(b, pos + 1)[0], float(count)
    d = {n: v for n, _, v in fields(b)}
    return d.get(2, 0.0), float(d.get(4, d.get(1, 0)))


def families(body: bytes):
    """(name, type, [Metric message]) of each family of a delimited MetricFamily stream
    (MetricFamily: name = 1, type = 3, metric = 4)."""
    pos = 0
    while pos < len(body):
        size, pos = _varint(body, pos)
        name, kind, metrics = "", 0, []
        for number, _, value in fields(body[pos:pos + size]):
            if number == 1:
                name = value.decode()
            elif number == 3:
                kind = value
            elif number == 4:
                metrics.append(value)
        pos += size
        yield name, kind, metrics


def decode(body: bytes) -> dict[tuple[str, frozenset], NativeHistogram]:
    """Every native histogram of a delimited MetricFamily stream, by (family, labels)."""
    out = {}
    for name, _, metrics in families(body):
        for m in metrics:
            labels, hist = {}, None
            for number, _, value in fields(m):
                if number == 1:
                    pair = {n: v.decode() for n, _, v in fields(value)}
                    labels[pair.get(1, "")] = pair.get(2, "")
                elif number == 7:
                    h, _, is_native = histogram(value)
                    hist = h if is_native else None
            if hist is not None:
                out[(name, frozenset(labels.items()))] = hist
    return out


def fetch(address: str, timeout: float = 5.0, ssl_context: ssl.SSLContext | None = None
          ) -> dict[tuple[str, frozenset], NativeHistogram]:
    """The native histograms of one endpoint ("host:port"), asked for in protobuf."""
    content_type, body = get(address, ACCEPT, timeout, ssl_context)
    if "protobuf" not in content_type:
        return {}  # an endpoint without the protobuf exposition has no native histograms
    return decode(body)


def get(address: str, accept: str, timeout: float = 5.0,
        ssl_context: ssl.SSLContext | None = None) -> tuple[str, bytes]:
    """(Content-Type, body) of one endpoint's /metrics (https with ssl_context); raises
    OSError (HTTPStatusError for a non-200 answer)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    conn = (http.client.HTTPSConnection(host, int(port), timeout=timeout, context=ssl_context)
            if ssl_context is not None else
            http.client.HTTPConnection(host, int(port), timeout=timeout))
    try:
        conn.request("GET", "/metrics", headers={"Accept": accept})
        r = conn.getresponse()
        body = r.read()
        if r.status != 200:
            raise HTTPStatusError(f"{address}: HTTP {r.status}")
        return r.getheader("Content-Type") or "", body
    finally:
        conn.close()
