"""Every use of a private name of the OpenTelemetry SDK or its Prometheus exporter, in this
module alone, each behind a guard with a public fallback.

Why private names: `Histogram.record` pays the SDK's whole dispatch on every op
(docs/development/performance.md), native histograms need an aggregation the SDK lacks, and exporters
before 0.63b0 take no `registry=`. Why one module: a release that renames one (nothing
promises they stay) must cost a fallback, never an import error or a lost op. Each name is
spelled once, in NAMES, AGGREGATION_FIELDS or OWNED, so tests/shims/test_otel_sdk.py can take
each away in turn. What a missing one costs (logged once per process; counted in every
Telemetry under names.OTEL_SDK_COMPONENT):
- the bound record or the row-age bulk add: `Histogram.record` per value (slower, same data);
- the native aggregation: the classic op-duration histogram alone, the native family absent;
- `registry=` or the reader's collector: the reader on prometheus_client's global registry.
"""
from __future__ import annotations

import importlib
import logging
import math
import re
import threading
from bisect import bisect_left
from collections import defaultdict
from operator import attrgetter

from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter
from opentelemetry.sdk.metrics.export import AggregationTemporality
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation

from ..names import COMPONENT_HISTOGRAM

log = logging.getLogger("dpobs_otel")
CUMULATIVE = AggregationTemporality.CUMULATIVE

# Attributes of SDK objects read here: role -> the SDK's name for it.
NAMES = {
    "consumer": "_measurement_consumer",      # instrument -> its MeasurementConsumer
    "storages": "_reader_storages",           # consumer -> {reader: MetricReaderStorage}
    "sdk_config": "_sdk_config",              # consumer -> SdkConfiguration
    "is_enabled": "_is_enabled",              # instrument -> bool() (1.39+)
    "matches_init": "_get_or_init_view_instrument_match",  # storage -> [match]
    "matches": "_instrument_view_instrument_matches",      # storage -> {instrument: [match]}
    "view": "_view",                          # match -> its View
    "attribute_keys": "_attribute_keys",      # View -> the attribute keys it keeps
    "aggregations": "_attributes_aggregation",  # match -> {attributes key: aggregation}
    "reset_on_collect": "_reset_on_collect",  # match -> bool (1.39+; absent: not bound)
    "collector": "_collector",                # PrometheusMetricReader -> its collector
}
# The explicit-bucket aggregation's fields that NativeAggregation and bulk_add update.
AGGREGATION_FIELDS = ("_lock", "_value", "_sum", "_min", "_max", "_record_min_max",
                      "_boundaries", "_instrument_aggregation_temporality")
# Module and class attributes: role -> (module, attribute path).
OWNED = {
    "hash_attributes": ("opentelemetry.sdk.metrics._internal._view_instrument_match",
                        "_hash_attributes"),
    "histogram_aggregation": ("opentelemetry.sdk.metrics._internal.aggregation",
                              "_ExplicitBucketHistogramAggregation"),
    "create_aggregation": ("opentelemetry.sdk.metrics.view",
                           "ExplicitBucketHistogramAggregation._create_aggregation"),
    "empty_buckets": ("opentelemetry.sdk.metrics._internal.aggregation",
                      "_ExplicitBucketHistogramAggregation._get_empty_bucket_counts"),
    "sample_exemplar": ("opentelemetry.sdk.metrics._internal.aggregation",
                        "_Aggregation._sample_exemplar"),
    "receive_metrics": ("opentelemetry.exporter.prometheus",
                        "PrometheusMetricReader._receive_metrics"),
    "sanitize_attribute": ("opentelemetry.exporter.prometheus._mapping",
                           "sanitize_attribute"),
}

_lock = threading.Lock()
_degraded: dict[str, str] = {}  # what fell back -> why, this process


def owned(role: str):
    """OWNED[role], or None where this SDK has no such name."""
    module, path = OWNED[role]
    try:
        return attrgetter(path)(importlib.import_module(module))
    except (ImportError, AttributeError):
        return None


def degrade(what: str, why: str) -> None:
    """Note (and log, once per process) that `what` runs on its public fallback."""
    with _lock:
        if what in _degraded:
            return
        _degraded[what] = why
    log.warning("dpobs: %s falls back to the OpenTelemetry public API: %s", what, why)


def degradations() -> dict[str, str]:
    with _lock:
        return dict(_degraded)


def reset() -> None:  # tests that take names away
    with _lock:
        _degraded.clear()
    _native_class.cache = None


# -- the attribute-set key -------------------------------------------------------------------
def attributes_key(attrs: dict):
    """The key the SDK files an attribute set's aggregation under (1.45: _hash_attributes;
    earlier: the frozenset of its items). Used only to find an aggregation the SDK made: a
    wrong key finds nothing, and the caller falls back to `record`."""
    hasher = owned("hash_attributes")
    return hasher(attrs) if hasher is not None else frozenset(attrs.items())


def _matches(storage, instrument, create: bool):
    if create:
        return getattr(storage, NAMES["matches_init"])(instrument)
    return getattr(storage, NAMES["matches"]).get(instrument, ())


def _aggregation(match, attributes: dict):
    keys = getattr(getattr(match, NAMES["view"]), NAMES["attribute_keys"])
    attrs = attributes if keys is None else {k: v for k, v in attributes.items() if k in keys}
    return getattr(match, NAMES["aggregations"]).get(attributes_key(attrs))


# -- the op duration's bound record ----------------------------------------------------------
_UNBOUND = None  # not tried yet
_UNBINDABLE = ()  # tried: `record` it is


class BoundRecord:
    """`record(value)` of one histogram and attribute set, straight into the SDK's
    aggregation objects once the SDK has made them (see otel_histogram.py for why and when)."""
    __slots__ = ("_instrument", "_attrs", "_storages", "_adds", "_current", "_on_error")

    def __init__(self, instrument, attributes: dict, on_error=None):
        self._instrument = instrument
        self._attrs = attributes
        self._storages = None
        self._adds = _UNBOUND
        self._current = attrgetter(f"{NAMES['consumer']}.{NAMES['storages']}")
        self._on_error = on_error  # (component, exc): a histogram that fails is counted

    def __call__(self, value: float) -> None:
        adds = self._adds
        try:
            if adds and self._current(self._instrument) is self._storages:
                for add in adds:
                    add(value)
                return
        except Exception as exc:  # the SDK moved under us: counted, `record` from now on
            self._adds = adds = _UNBINDABLE
            self._failed(exc)
        try:
            self._instrument.record(value, self._attrs)
            if adds is _UNBOUND or adds:  # first call, or the readers changed: (re)bind
                self._storages, self._adds = self._bind()
        except Exception as exc:  # never cost the op its counters (account.Account.record_op)
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        if self._on_error is not None:
            self._on_error(COMPONENT_HISTOGRAM, exc)

    def _bind(self) -> tuple:
        """(the reader storages, the add methods of this attribute set's aggregations), or
        (None, _UNBINDABLE) where adding directly would not be what `record` does."""
        instrument = self._instrument
        try:
            consumer = getattr(instrument, NAMES["consumer"])
            config = getattr(consumer, NAMES["sdk_config"])
            if not isinstance(config.exemplar_filter, AlwaysOffExemplarFilter) \
                    or not getattr(instrument, NAMES["is_enabled"])():
                return None, _UNBINDABLE
            storages = getattr(consumer, NAMES["storages"])
            native = _native_class()
            adds = []
            for storage in storages.values():
                for match in _matches(storage, instrument, create=True):
                    agg = _aggregation(match, self._attrs)
                    if getattr(match, NAMES["reset_on_collect"]) or native is None \
                            or type(agg) is not native:
                        return None, _UNBINDABLE
                    adds.append(agg.add)
            return storages, tuple(adds) or _UNBINDABLE
        except Exception as exc:  # another SDK's internals: `record` is always right
            degrade("the op duration's bound record", repr(exc))
            return None, _UNBINDABLE


# -- many observations at once (row age) -----------------------------------------------------
def histogram_aggregations(histogram, attrs: dict, boundaries: tuple) -> list | None:
    """The SDK's explicit-bucket aggregations that a record() of `histogram` with `attrs`
    feeds, one per reader: None when one does not exist yet, [] when the internals are not as
    this code knows them (the caller records one value per call)."""
    try:
        base = owned("histogram_aggregation")
        consumer = getattr(histogram, NAMES["consumer"])
        out = []
        for storage in getattr(consumer, NAMES["storages"]).values():
            for match in _matches(storage, histogram, create=False):
                agg = _aggregation(match, attrs)
                if agg is None:
                    return None
                if (base is None or type(agg) is not base
                        or getattr(match, NAMES["reset_on_collect"])
                        or agg._boundaries != boundaries
                        or not all(hasattr(agg, f) for f in AGGREGATION_FIELDS)):
                    raise LookupError(f"aggregation {type(agg).__name__} not as known")
                out.append(agg)
        return out or None
    except Exception as exc:
        degrade("the row-age bulk add", repr(exc))
        return []


def bulk_add(agg, counts: list, total: float, low: float, top: float) -> None:
    """As sum(counts) record() calls of values whose bucket counts, sum, min and max these
    are, under the aggregation's lock."""
    with agg._lock:
        if agg._value is None:
            agg._value = [0] * (len(agg._boundaries) + 1)
        agg._value = [a + c for a, c in zip(agg._value, counts)]
        agg._sum += total
        if agg._record_min_max:
            agg._min = min(agg._min, low)
            agg._max = max(agg._max, top)


# -- the op duration's aggregation: classic and native buckets -------------------------------
def _native_class(scale: int | None = None, finish=None):
    """The SDK's explicit-bucket aggregation with native buckets at `scale` beside it, its
    cumulative points finished by finish(point, {j: count}) (native_histograms.with_native);
    made once, then returned without arguments. None where the SDK's class or one of its
    fields is not as known (one observation through a fresh instance must come out right)."""
    cached = getattr(_native_class, "cache", None)
    if cached is not None or scale is None:
        return cached or None
    cls, why = None, "unknown"
    try:
        cls = _make_native_class(scale, finish)
        why = _self_test(cls, scale)
    except Exception as exc:
        why = repr(exc)
    if why:
        degrade("the native op-duration histogram", why)
        cls = None
    _native_class.cache = cls or False
    return cls


def _make_native_class(scale: int, finish):
    base = owned("histogram_aggregation")
    if base is None or owned("empty_buckets") is None or owned("sample_exemplar") is None:
        raise LookupError("the SDK's explicit-bucket aggregation is not as known")
    per_octave, log2, ceil = 2 ** scale, math.log2, math.ceil

    class NativeAggregation(base):
        """aggregate() does the SDK's classic update (the same fields, the same way) and the
        native one under one lock: calling the SDK's and then taking a lock of our own cost
        twice as much, on the path every op takes. Native buckets count since creation (key
        None: the zero bucket); only cumulative collections carry them."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._native = defaultdict(int)

        def aggregate(self, measurement, should_sample_exemplar: bool = True) -> None:
            self.add(measurement.value)
            self._sample_exemplar(measurement, should_sample_exemplar)

        def add(self, v: float) -> None:
            """One observation, without a Measurement (BoundRecord calls this directly)."""
            try:  # bucket j holds (2**((j-1)/2**scale), 2**(j/2**scale)]
                j = ceil(log2(v) * per_octave)
            except (ValueError, OverflowError):  # 0 (a coarse clock's): the zero bucket, as
                j = None  # would a negative, NaN or infinite value, which no clock gives
            with self._lock:
                if self._value is None:
                    self._value = self._get_empty_bucket_counts()
                self._sum += v
                if self._record_min_max:
                    if v < self._min:
                        self._min = v
                    if v > self._max:
                        self._max = v
                self._value[bisect_left(self._boundaries, v)] += 1
                self._native[j] += 1

        def collect(self, collection_aggregation_temporality, collection_start_nano: int):
            """The SDK's point, finished with the native buckets for a cumulative collection
            (a record between the two snapshots is in the buckets and not yet in the sum: a
            scrape later, it is)."""
            point = super().collect(collection_aggregation_temporality, collection_start_nano)
            if point is None or collection_aggregation_temporality is not CUMULATIVE:
                return point
            with self._lock:
                counts = dict(self._native)
            return finish(point, counts)

    return NativeAggregation


def _self_test(cls, scale: int) -> str:
    """'' when one observation through a fresh `cls` comes out as the classic and native
    point it must be; else what differs."""
    agg = cls({}, AggregationTemporality.DELTA, 0, lambda **kw: _NoExemplars(), (1, 2), True)
    missing = [f for f in AGGREGATION_FIELDS if not hasattr(agg, f)]
    if missing:
        return f"fields missing: {missing}"
    agg.add(1.5)
    p = agg.collect(CUMULATIVE, 1)
    n = getattr(p, "native", None)
    got = (p.count, p.sum, list(p.bucket_counts), n and (n.count, n.zero_count, n.buckets))
    want = (1, 1.5, [0, 1, 0], (1, 0, ((math.ceil(math.log2(1.5) * 2 ** scale), 1),)))
    return "" if got == want else f"one observation came out as {got}"


class _NoExemplars:
    """An exemplar reservoir that keeps nothing (exemplars are off in every dpobs provider)."""
    offer = collect = staticmethod(lambda *args, **kwargs: [])


class OpDurationAggregation(ExplicitBucketHistogramAggregation):
    """The op duration View's aggregation: classic buckets for every reader, native ones at
    exporters/native_histograms.SCALE for NativeReader (see op_duration_aggregation)."""

    def _create_aggregation(self, instrument, attributes, reservoir_factory,
                            start_time_unix_nano):
        classic = super()._create_aggregation(instrument, attributes, reservoir_factory,
                                              start_time_unix_nano)
        return _native_class()(attributes, classic._instrument_aggregation_temporality,
                               start_time_unix_nano,
                               reservoir_factory(owned("histogram_aggregation")),
                               classic._boundaries, classic._record_min_max)


def op_duration_aggregation(boundaries, scale: int, finish):
    """The op duration's aggregation: classic and native (see _native_class) where this SDK
    and exporter allow (the reader's hook takes the native buckets out), else the SDK's own
    explicit-bucket one, the native family then absent."""
    if _native_class(scale, finish) is None:
        return ExplicitBucketHistogramAggregation(boundaries=boundaries)
    missing = [r for r in ("create_aggregation", "receive_metrics") if owned(r) is None]
    if missing:
        degrade("the native op-duration histogram", f"{missing} not found")
        return ExplicitBucketHistogramAggregation(boundaries=boundaries)
    return OpDurationAggregation(boundaries=boundaries)


# -- the Prometheus exporter -----------------------------------------------------------------
def prometheus_reader(cls, registry) -> tuple:
    """(reader, the registry that serves it): cls(registry=registry, scope_info_enabled=False)
    on exporter 0.63b0+; with an older exporter, the reader built without them and its
    collector moved from prometheus_client's global registry to one of its own, or, where
    that cannot be done, the global registry itself (a second Telemetry in the process then
    shares it)."""
    try:
        # scope labels would ride on every series without telling anyone anything.
        return cls(registry=registry, scope_info_enabled=False), registry
    except TypeError as exc:
        degrade("the reader's own registry", repr(exc))
    from prometheus_client import REGISTRY, CollectorRegistry

    reader = cls()
    try:
        collector = getattr(reader, NAMES["collector"])
        REGISTRY.unregister(collector)
        # a registry that describes by collecting would collect before the provider exists
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
    except Exception as exc:
        degrade("the reader's collector", repr(exc))
        return reader, REGISTRY
    reader._dpobs_registry = registry
    return reader, registry


def release_reader(reader) -> bool:
    """The shutdown of a reader prometheus_reader moved (True: done, the caller must not run
    the exporter's own). An old exporter's shutdown unregisters its collector from the
    global registry, where it is not: a KeyError, or, moved back there first, a clash with
    another reader's names that failed MeterProvider.shutdown (the floor cell, exporter
    0.59b0). Its collector leaves the registry it was moved to instead."""
    registry = getattr(reader, "_dpobs_registry", None)
    if registry is None:
        return False
    with _lock:
        try:
            registry.unregister(getattr(reader, NAMES["collector"]))
        except KeyError:  # shut down before
            pass
    return True


_LABEL = re.compile(r"[^a-zA-Z0-9_]")


def sanitize_attribute(key: str) -> str:
    """The exporter's label name for an attribute key (its own function where it has it)."""
    fn = owned("sanitize_attribute")
    return fn(key) if fn is not None else _LABEL.sub("_", key)
