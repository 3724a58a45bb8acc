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
from .native import families, fields, histogram

COUNTER, GAUGE, UNTYPED, HISTOGRAM = 0, 1, 3, 4  # enum MetricType
# Metric's field holding the value of each single-value type (gauge = 2, counter = 3,
# untyped = 5; each a message with double value = 1); histogram = 7; label = 1
_VALUE_FIELD = {GAUGE: 2, COUNTER: 3, UNTYPED: 5}
_HISTOGRAM_FIELD = 7

# LabelPair message bytes -> (name, value): label pairs repeat across metrics, scrapes and
# processes, and decoding them is most of the walk (as label parsing is of the text's).
_PAIRS: dict[bytes, tuple[str, str]] = {}
_PAIRS_MAX = 50_000
_LE: dict[float, str] = {}  # upper bound -> its text form (the text format's)

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
                labels, body_bytes = _metric(m, want)
                value = 0.0
                if body_bytes is not None:
                    for number, _, v in fields(body_bytes):
                        if number == 1:
                            value = v
                samples.append((name, labels, value))
        elif kind == HISTOGRAM:
            for m in metrics:
                labels, h = _metric(m, _HISTOGRAM_FIELD)
                if h is not None:
                    _histogram_samples(name, labels, h, samples, hists,
                                       name in bucketless)
    return samples, hists


def _metric(m: bytes, want: int) -> tuple[dict, bytes | None]:
    """A Metric message's labels and the bytes of its field `want` (None when absent)."""
    labels, body = {}, None
    for number, _, value in fields(m):
        if number == 1:
            pair = _PAIRS.get(value)
            if pair is None:
                if len(_PAIRS) >= _PAIRS_MAX:
                    _PAIRS.clear()
                got = {n: v.decode() for n, _, v in fields(value)}
                pair = _PAIRS[value] = (got.get(1, ""), got.get(2, ""))
            labels[pair[0]] = pair[1]
        elif number == want:
            body = value
    return labels, body


def _histogram_samples(name: str, labels: dict, buf: bytes, samples: list, hists: dict,
                       bucketless: bool) -> None:
    h, classic, is_native = histogram(buf)
    if is_native:
        hists[(name, frozenset(labels.items()))] = h
        if not classic:
            return  # native only: not in the text exposition
    if not bucketless:
        bounds = set()
        for bound, cumulative in classic:
            bounds.add(bound)
            samples.append((name + "_bucket", {**labels, "le": _le(bound)}, cumulative))
        if math.inf not in bounds:
            samples.append((name + "_bucket", {**labels, "le": "+Inf"}, h.count))
    samples.append((name + "_sum", labels, h.sum))
    samples.append((name + "_count", labels, h.count))


def _le(bound: float) -> str:
    """The text format's `le` of an upper bound (Go's float formatting, as
    prometheus_client writes it: "+Inf", "0.005", "1.0")."""
    s = _LE.get(bound)
    if s is None:
        s = _LE[bound] = "+Inf" if bound == math.inf else repr(float(bound))
    return s
