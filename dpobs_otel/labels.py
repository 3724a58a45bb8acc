"""Bounded label values: every attribute dpobs records takes a bounded set of values.

Most attributes are closed sets the code spells (op, direction, stage, side, component,
reason): bounded by construction. Three come from the user's program: `error_type` (an
exception's class name), the guard's `field` (a TensorDict key) and Ray's `method` (its own
bound, adapters/ray/methods.py). Each of those keeps the first `limit` values it sees in a
process; every later one is recorded as OTHER.

An instrument that still reaches the OpenTelemetry SDK's cardinality limit (2000 label sets by
default) has its further label sets folded into one point carrying OVERFLOW_ATTRIBUTE;
overflowed() finds them in a collection, and the Telemetry counts them (component overflow).

Why `other` and not OpenTelemetry's `_OTHER`: `other` is what the project's first bounded
label (Ray's method) already records, so one value means "past the bound" on every series,
and the rules and panels that read it need no second spelling; `_OTHER` is a semantic
convention for HTTP methods, not a general one. docs/development/scaling.md lists every
attribute with its bound.
"""
from __future__ import annotations

import threading

OTHER = "other"
# Distinct exception class names a process records as error_type (core and Ray ops share one
# set; the guard keeps its own). A job's failures are a handful of classes; 32 leaves room
# for a store's whole error family and keeps an instrument's worst case (ops x 33) far under
# the SDK's 2000 label sets.
ERROR_TYPE_LIMIT = 32
# Distinct TensorDict fields (nested keys joined) the guard labels its counts with.
FIELD_LIMIT = 256


class Bounded:
    """value -> itself for the first `limit` distinct values, OTHER for every later one.
    Thread-safe; a value already admitted costs one set lookup."""
    __slots__ = ("_seen", "_limit", "_lock")

    def __init__(self, limit: int):
        self._seen: set[str] = set()
        self._limit = limit
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) >= self._limit:
                return OTHER
            self._seen.add(value)
        return value


# The attribute of the SDK's overflow point (the specification's name, public).
OVERFLOW_ATTRIBUTE = "otel.metric.overflow"


def overflowed(metrics_data) -> list[str]:
    """The names of the instruments whose points in this collection (the SDK's MetricsData)
    include the overflow point."""
    out = []
    for rm in getattr(metrics_data, "resource_metrics", ()):
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points = getattr(m.data, "data_points", ())
                if any(p.attributes and p.attributes.get(OVERFLOW_ATTRIBUTE) for p in points):
                    out.append(m.name)
    return out
