"""The op duration's record, bound to one attribute set: straight into the SDK's own
aggregation objects once the SDK has made them.

Why: `Histogram.record` builds a Measurement, reads the context, asks the exemplar filter,
copies and sorts the attributes to hash them, and finds the aggregation again for every
reader, on every op; that dispatch was most of dpobs's cost per op (docs/development/performance.md).
Nothing about it changes between two ops of the same name, so after the first record of an
op the aggregations it reached are kept, and later ops add to them directly. What the SDK
collects and every reader exports is unchanged: the same aggregation objects, updated the
same way (otel_sdk.py `NativeAggregation.add`).

It binds only where that is exact, and otherwise keeps calling `record`: every reader's
match keeps its aggregations across collections (none resets them for delta temporality),
every aggregation is ours, exemplars are off (Telemetry's MeterProvider turns them off),
the instrument is enabled, and the attribute set is under the cardinality limit. A reader
added later replaces the storages the binding was made on: checked on each call. The binding
reads the SDK's private names, so it lives in otel_sdk.py; where they are not as known,
every op takes `record`.
"""
from __future__ import annotations

from bisect import bisect_left

from ..names import COMPONENT_HISTOGRAM
from .otel_sdk import BoundRecord, bulk_add, histogram_aggregations


class OpRecords(dict):
    """op -> its BoundRecord of `instrument`; an op not seen before (an adapter's own) gets
    one on first use. on_error(component, exc) counts a record that failed."""

    def __init__(self, instrument, attrs: dict[str, dict], on_error=None):
        super().__init__((op, BoundRecord(instrument, a, on_error)) for op, a in attrs.items())
        self._instrument = instrument
        self._on_error = on_error

    def __missing__(self, op: str) -> BoundRecord:
        return self.setdefault(op, BoundRecord(self._instrument, {"op": op}, self._on_error))


class ClassicRecord:
    """`record(value)` of an explicit-bucket histogram (the SDK's own aggregation, no native
    buckets) and one attribute set, many values at a time: after the first record, straight
    into the aggregations that record reached, one update of each per batch, as row age's
    bulk add does (otel_sdk.histogram_aggregations finds them and checks their fields and
    bounds). Where they are not as known, `record` each value. Readers are fixed when a
    Telemetry starts, so the aggregations found stay the ones every reader collects."""
    __slots__ = ("_instrument", "_attrs", "_boundaries", "_aggs", "_on_error")

    def __init__(self, instrument, attributes: dict, boundaries: tuple, on_error=None):
        self._instrument = instrument
        self._attrs = attributes
        self._boundaries = tuple(float(b) for b in boundaries)
        self._aggs = None  # None: not found yet; []: never (record it is)
        self._on_error = on_error  # (component, exc)

    def many(self, values: list) -> None:
        """As record(v) for each of `values` (a non-empty list)."""
        try:
            aggs = self._aggs
            if aggs:
                counts = [0] * (len(self._boundaries) + 1)
                for v in values:
                    counts[bisect_left(self._boundaries, v)] += 1
                total, low, top = sum(values), min(values), max(values)
                for agg in aggs:
                    bulk_add(agg, counts, total, low, top)
                return
            for v in values:
                self._instrument.record(v, self._attrs)
            if aggs is None:
                self._aggs = histogram_aggregations(self._instrument, self._attrs,
                                                    self._boundaries)
        except Exception as exc:  # never cost the op its counters
            self._aggs = []
            if self._on_error is not None:
                self._on_error(COMPONENT_HISTOGRAM, exc)
