"""The op duration's record, bound to one attribute set: straight into the SDK's own
aggregation objects once the SDK has made them.

Why: `Histogram.record` builds a Measurement, reads the context, asks the exemplar filter,
copies and sorts the attributes to hash them, and finds the aggregation again for every
reader, on every op; that dispatch was most of dpobs's cost per op (docs/performance.md).
Nothing about it changes between two ops of the same name, so after the first record of an
op the aggregations it reached are kept, and later ops add to them directly. What the SDK
collects and every reader exports is unchanged: the same aggregation objects, updated the
same way (exporters/native.py `_ClassicAndNative.add`).

It binds only where that is exact, and otherwise keeps calling `record`: every reader's
match keeps its aggregations across collections (none resets them for delta temporality),
every aggregation is ours, exemplars are off (Telemetry's MeterProvider turns them off),
the instrument is enabled, and the attribute set is under the cardinality limit. A reader
added later replaces the storages the binding was made on: checked on each call.
"""
from __future__ import annotations

from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter
from opentelemetry.sdk.metrics._internal._view_instrument_match import _hash_attributes

from .exporters.native import _ClassicAndNative

_UNBOUND = None  # not tried yet
_UNBINDABLE = ()  # tried: `record` it is


class BoundRecord:
    """`record(value)` of one histogram and attribute set."""
    __slots__ = ("_instrument", "_attrs", "_storages", "_adds")

    def __init__(self, instrument, attributes: dict):
        self._instrument = instrument
        self._attrs = attributes
        self._storages = None
        self._adds = _UNBOUND

    def __call__(self, value: float) -> None:
        adds = self._adds
        if adds and self._instrument._measurement_consumer._reader_storages is self._storages:
            for add in adds:
                add(value)
            return
        self._instrument.record(value, self._attrs)
        if adds is _UNBOUND or adds:  # first call, or the readers changed: (re)bind
            self._storages, self._adds = _bind(self._instrument, self._attrs)


def _bind(instrument, attributes: dict) -> tuple:
    """(the reader storages, the add methods of this attribute set's aggregations), or
    (None, _UNBINDABLE) where adding directly would not be what `record` does."""
    try:
        consumer = instrument._measurement_consumer
        if not isinstance(consumer._sdk_config.exemplar_filter, AlwaysOffExemplarFilter) \
                or not instrument._is_enabled():
            return None, _UNBINDABLE
        storages = consumer._reader_storages
        adds = []
        for storage in storages.values():
            for match in storage._get_or_init_view_instrument_match(instrument):
                keys = match._view._attribute_keys
                attrs = attributes if keys is None else {
                    k: v for k, v in attributes.items() if k in keys}
                agg = match._attributes_aggregation.get(_hash_attributes(attrs))
                if match._reset_on_collect or type(agg) is not _ClassicAndNative:
                    return None, _UNBINDABLE
                adds.append(agg.add)
        return storages, tuple(adds) or _UNBINDABLE
    except Exception:  # another SDK's internals: `record` is always right
        return None, _UNBINDABLE


class OpRecords(dict):
    """op -> its BoundRecord of `instrument`; an op not seen before (an adapter's own) gets
    one on first use."""

    def __init__(self, instrument, attrs: dict[str, dict]):
        super().__init__((op, BoundRecord(instrument, a)) for op, a in attrs.items())
        self._instrument = instrument

    def __missing__(self, op: str) -> BoundRecord:
        return self.setdefault(op, BoundRecord(self._instrument, {"op": op}))
