"""The guard's cumulative counts: plain numbers under one lock, read by observable counters at
collection time and copied by `WireGuard.totals()` for per-step loggers (as the core's
stats.py does for ops), so the hot path never calls an SDK instrument."""
from __future__ import annotations

import threading

from opentelemetry.metrics import CallbackOptions, Observation

from .. import names

# kind -> (instrument name, unit, attribute, description)
KINDS = {
    "recorded": (names.GUARD_RECORDED, "{row}", "field",
                 "Rows given a wire fingerprint at put, per field"),
    "checked": (names.GUARD_CHECKED, "{row}", "field",
                "Rows whose wire fingerprint was recomputed and compared at get, per field"),
    "mismatched": (names.GUARD_MISMATCHED, "{row}", "field",
                   "Checked rows whose wire fingerprint differed from the writer's, per field"),
    "unverified": (names.GUARD_UNVERIFIED, "{row}", "field",
                   "Rows read back without a usable wire fingerprint, per field"),
    "skipped": (names.GUARD_SKIPPED, "{field}", "reason",
                "Fields the wire guard could not fingerprint or compare, per reason"),
    "failures": (names.GUARD_FAILURES, "{error}", "error_type",
                 "Exceptions raised inside the wire guard (swallowed), per error type"),
}


class GuardCounts:
    def __init__(self):
        self.lock = threading.Lock()
        self._by_kind: dict[str, dict[str, int]] = {kind: {} for kind in KINDS}

    def add(self, kind: str, key: str, n: int, also: tuple[str, int] | None = None) -> None:
        """counts[kind][key] += n (and counts[also[0]][key] += also[1], under the same lock:
        checked and mismatched move together, so no scrape sees one without the other)."""
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
        for kind, (name, unit, attr, desc) in KINDS.items():
            meter.create_observable_counter(name, callbacks=[self._observer(kind, attr, on_error)],
                                            unit=unit, description=desc)

    def _observer(self, kind, attr, on_error):
        def observe(options: CallbackOptions):
            try:
                with self.lock:
                    return [Observation(v, {attr: k}) for k, v in self._by_kind[kind].items()]
            except Exception as exc:
                on_error(exc)
                return []
        observe.__name__ = f"observe_guard_{kind}"
        return observe
