"""A protobuf /metrics body (delimited io.prometheus.client.MetricFamily) as the samples the
text exposition of the same moment holds, plus the native histograms only the protobuf one
holds: what lets the cluster view read a process with one request (`read`).

    totals, hists = protobody.read(target)  # one request: ProcessTotals, op -> histogram
    samples, hists = protobody.decode(body)  # a body in hand:
    # samples: [(sample name, labels, value)], as scrape's text reading yields them
    # hists: {(family, labels): NativeHistogram}, as native.decode gives them

The samples follow the text format's naming, which is the family's for our encoder
(exporters/protobuf.py) and for client_golang's alike: a counter's or gauge's sample is the
family name (counters already end in `_total`), a classic histogram's are `<family>_bucket`
with `le` (cumulative, "+Inf" added from the count when the message leaves it out, as
client_golang does), `<family>_sum` and `<family>_count`. A histogram that is native only
(no classic bucket) has no text form here: our text exposition leaves it out. Summaries, and
families outside `keep`, are skipped: nothing reads them. The wire walking is native.py's.
"""
from __future__ import annotations

import math
import ssl
import time

from .. import names
from . import native, scrape
from .native import DOUBLE, families, fields, histogram

COUNTER, GAUGE, UNTYPED, HISTOGRAM = 0, 1, 3, 4  # enum MetricType
# Metric's field holding the value of each single-value type (gauge = 2, counter = 3,
# untyped = 5; each a message with double value = 1); histogram = 7; label = 1
_VALUE_FIELD = {GAUGE: 2, COUNTER: 3, UNTYPED: 5}
_HISTOGRAM_FIELD = 7

# A Metric's label pairs (label = 1) come first, as our encoder and client_golang write
# them. Their bytes -> the labels (shared and never changed, as scrape's text labels are):
# label sets repeat across scrapes and processes, and decoding them would be most of a
# body's walk (as label parsing is of the text's). (label set bytes, le) -> with `le`.
_LABELS: dict[bytes, dict[str, str]] = {}
_BUCKET_LABELS: dict[tuple[bytes, float], dict[str, str]] = {}
_LABELS_MAX = 50_000

# Protobuf first; text from endpoints without it (an older dpobs, another exporter), which
# answer this Accept in text as they answer Prometheus's.
ACCEPT = native.ACCEPT + ";q=0.7,text/plain;version=0.0.4;q=0.3"
_KEEP = ("dpobs_", "target_info")  # the families scrape's text reading reads too
# histogram families whose buckets nothing reads (the text reading skips their lines)
_BUCKETLESS = frozenset(u.removesuffix("_bucket") for u in scrape._UNUSED)


def read(target: scrape.Target, timeout: float = 1.0,
         ssl_context: ssl.SSLContext | None = None
         ) -> tuple[scrape.ProcessTotals, dict | None]:
    """One endpoint in one request: `parse` of its answer to ACCEPT, timestamped when the
    answer arrived. Raises as scrape.fetch does."""
    content_type, body = native.get(target.address, ACCEPT, timeout, ssl_context)
    return parse(content_type, body, time.time())


def parse(content_type: str, body: bytes, timestamp: float = 0.0
          ) -> tuple[scrape.ProcessTotals, dict | None]:
    """(ProcessTotals, op -> cumulative native op-duration histogram) of a protobuf body;
    (ProcessTotals, None) of a text one, which cannot hold native histograms."""
    if "protobuf" not in content_type:
        return scrape.parse(body.decode(), timestamp), None
    samples, hists = decode(body, _KEEP, _BUCKETLESS)
    return (scrape.totals_from_samples(samples, timestamp),
            native.by_label(hists, names.OP_DURATION_NATIVE_SERIES, "op"))


def decode(body: bytes, keep: tuple[str, ...] = ("",), bucketless: frozenset = frozenset()
           ) -> tuple[list[tuple[str, dict, float]], dict]:
    """(samples, native histograms) of one body. keep: family-name prefixes to read (others
    are skipped, native histograms included); bucketless: histogram families whose
    `_bucket` samples are not wanted (only their _sum and _count)."""
    samples, hists = [], {}
    for name, kind, metrics in families(body):
        if not name.startswith(keep):
            continue
        if kind in _VALUE_FIELD:
            want = _VALUE_FIELD[kind]
            for m in metrics:
                _, labels, b = _metric(m, want)
                if b is None:
                    value = 0.0
                elif len(b) == 9 and b[0] == 0x09:  # value = 1, a double: all it holds
                    value = DOUBLE(b, 1)[0]
                else:
                    value = next((v for n, _, v in fields(b) if n == 1), 0.0)
                samples.append((name, labels, value))
        elif kind == HISTOGRAM:
            for m in metrics:
                key, labels, h = _metric(m, _HISTOGRAM_FIELD)
                if h is not None:
                    _histogram_samples(name, key, labels, h, samples, hists,
                                       name in bucketless)
    return samples, hists


def _metric(m: bytes, want: int) -> tuple[bytes, dict, bytes | None]:
    """A Metric message's (label set bytes, labels, bytes of its field `want` or None)."""
    pos, end = 0, len(m)
    while pos < end and m[pos] == 0x0A:  # label = 1, length-delimited
        size, start = native._varint(m, pos + 1)
        pos = start + size
    key = m[:pos]
    labels = _LABELS.get(key)
    if labels is None:
        if len(_LABELS) >= _LABELS_MAX:
            _LABELS.clear()
            _BUCKET_LABELS.clear()
        labels = _LABELS[key] = dict(_pair(v) for _, _, v in fields(key))
    body = None
    for number, _, value in fields(m[pos:]):
        if number == want:
            body = value
        elif number == 1:  # a label after the value: not memoised
            labels = dict(labels, **dict([_pair(value)]))
            key = None
    return key, labels, body


def _pair(buf: bytes) -> tuple[str, str]:
    got = {n: v.decode() for n, _, v in fields(buf)}  # LabelPair: name = 1, value = 2
    return got.get(1, ""), got.get(2, "")


def _histogram_samples(name: str, key: bytes | None, labels: dict, buf: bytes,
                       samples: list, hists: dict, bucketless: bool) -> None:
    h, classic, is_native = histogram(buf)
    if is_native:
        hists[(name, frozenset(labels.items()))] = h
        if not classic:
            return  # native only: not in the text exposition
    if not bucketless:
        bucket, inf = name + "_bucket", False
        for bound, cumulative in classic:
            inf = inf or bound == math.inf
            samples.append((bucket, _with_le(key, labels, bound), cumulative))
        if not inf:
            samples.append((bucket, _with_le(key, labels, math.inf), h.count))
    samples.append((name + "_sum", labels, h.sum))
    samples.append((name + "_count", labels, h.count))


def _with_le(key: bytes | None, labels: dict, bound: float) -> dict:
    got = _BUCKET_LABELS.get((key, bound)) if key is not None else None
    if got is None:
        got = dict(labels, le=_le(bound))
        if key is not None:
            _BUCKET_LABELS[(key, bound)] = got
    return got


def _le(bound: float) -> str:
    """The text format's `le` of an upper bound (Go's float formatting, as
    prometheus_client writes it: "+Inf", "0.005", "1.0")."""
    return "+Inf" if bound == math.inf else repr(float(bound))
