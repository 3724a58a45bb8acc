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

from .otel_sdk import BoundRecord


class OpRecords(dict):
    """op -> its BoundRecord of `instrument`; an op not seen before (an adapter's own) gets
    one on first use. on_error(component, exc) counts a record that failed."""

    def __init__(self, instrument, attrs: dict[str, dict], on_error=None):
        super().__init__((op, BoundRecord(instrument, a, on_error)) for op, a in attrs.items())
        self._instrument = instrument
        self._on_error = on_error

    def __missing__(self, op: str) -> BoundRecord:
        return self.setdefault(op, BoundRecord(self._instrument, {"op": op}, self._on_error))
