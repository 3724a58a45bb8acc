"""The guard's cumulative counts: plain numbers under one lock, read by observable counters at
collection time and copied by `WireGuard.totals()` for per-step loggers (as the core's
stats.py does for ops), so the hot path never calls an SDK instrument."""
from __future__ import annotations

import functools
import threading

from opentelemetry.metrics import Observation

from .. import instruments, labels, names

# kind -> (instrument name, the attribute its counts are keyed by)
KINDS = {
    "recorded": (names.GUARD_RECORDED, "field"),
    "checked": (names.GUARD_CHECKED, "field"),
    "mismatched": (names.GUARD_MISMATCHED, "field"),
    "unverified": (names.GUARD_UNVERIFIED, "field"),
    "skipped": (names.GUARD_SKIPPED, "reason"),
    "failures": (names.GUARD_FAILURES, "error_type"),
}


class GuardCounts:
    def __init__(self):
        self.lock = threading.Lock()
        self._by_kind: dict[str, dict[str, int]] = {kind: {} for kind in KINDS}
        # the user's values are bounded (labels.py); reasons are the guard's own closed set
        field, error_type = labels.Bounded(labels.FIELD_LIMIT), labels.Bounded(
            labels.ERROR_TYPE_LIMIT)
        self._bound = {kind: {"field": field, "error_type": error_type}.get(attr, str)
                       for kind, (_, attr) in KINDS.items()}

    def add(self, kind: str, key: str, n: int, also: tuple[str, int] | None = None) -> None:
        """counts[kind][key] += n (and counts[also[0]][key] += also[1], under the same lock:
        checked and mismatched move together, so no scrape sees one without the other)."""
        key = self._bound[kind](key)
        with self.lock:
            d = self._by_kind[kind]
            d[key] = d.get(key, 0) + n
            if also is not None:
                d = self._by_kind[also[0]]
                d[key] = d.get(key, 0) + also[1]

    def snapshot(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return {kind: dict(d) for kind, d in self._by_kind.items()}

    def register(self, meter, on_error) -> None:
        """One observable counter per kind; a failing callback is counted, never raised."""
        for kind, (name, attr) in KINDS.items():
            instruments.create(meter, name, functools.partial(self._observe, kind, attr), on_error)

    def _observe(self, kind: str, attr: str) -> list[Observation]:
        with self.lock:
            return [Observation(v, {attr: k}) for k, v in self._by_kind[kind].items()]
