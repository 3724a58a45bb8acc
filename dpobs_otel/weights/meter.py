"""The weight-sync instruments and the plain numbers behind them (one lock, read at
collection like the client's Stats): what each completed sync side adds."""
from __future__ import annotations

import threading

from opentelemetry.metrics import Observation

from .. import instruments, names

# why a receiver's tensors went unchecked (carriage.py): no store to read, no manifest in
# time (or none in band), the store failed
UNCHECKED_REASONS = ("no_store", "no_manifest", "store_error")


class WeightStats:
    def __init__(self):
        self.lock = threading.Lock()
        self.syncs = {side: 0 for side in names.WEIGHT_SIDES}
        self.seconds = {side: 0.0 for side in names.WEIGHT_SIDES}
        self.bytes = {side: 0 for side in names.WEIGHT_SIDES}
        self.tensors = {side: 0 for side in names.WEIGHT_SIDES}
        self.version: dict[str, int] = {}  # side -> version of its last completed sync
        self.checked = 0
        self.mismatched = {reason: 0 for reason in names.WEIGHT_MISMATCH_REASONS}
        self.unchecked = dict.fromkeys(UNCHECKED_REASONS, 0)
        self.step_seconds = 0.0  # sync time inside an open step of the syncing thread
        self.step_syncs = 0  # syncs that ran inside a step (the series exists from the first)

    def snapshot(self) -> dict:
        with self.lock:
            return {"syncs": sum(self.syncs.values()), "seconds": sum(self.seconds.values()),
                    "bytes": sum(self.bytes.values()), "tensors": sum(self.tensors.values()),
                    "checked": self.checked, "mismatched": sum(self.mismatched.values()),
                    "unchecked": sum(self.unchecked.values()),
                    "step_seconds": self.step_seconds,
                    "version": max(self.version.values(), default=None)}


class WeightMeter:
    """Creates the instruments on a Telemetry's meter; `add` records one completed side."""

    def __init__(self, meter, on_error):
        self.stats = st = WeightStats()
        self.duration = instruments.create(meter, names.WEIGHTS_SYNC_DURATION)
        observed = {
            names.WEIGHTS_TRANSFERRED: lambda: _by_side(st, st.bytes),
            names.WEIGHTS_TENSORS: lambda: _by_side(st, st.tensors),
            names.WEIGHTS_VERSION: lambda: _versions(st),
            names.WEIGHTS_CHECKED: lambda: _checked(st),
            names.WEIGHTS_MISMATCHED: lambda: _mismatched(st),
            names.STEP_WEIGHT_SYNC: lambda: _step_seconds(st),
        }
        for name, observe in observed.items():
            instruments.create(meter, name, observe, on_error)
        self.attrs = {side: {"side": side} for side in names.WEIGHT_SIDES}

    def add(self, side: str, version: int, seconds: float, nbytes: int, tensors: int,
            in_step: bool, check=None) -> None:
        self.duration.record(seconds, self.attrs[side])
        st = self.stats
        with st.lock:
            st.syncs[side] += 1
            st.seconds[side] += seconds
            st.bytes[side] += nbytes
            st.tensors[side] += tensors
            st.version[side] = int(version)
            if in_step:
                st.step_seconds += seconds
                st.step_syncs += 1
        if check is not None:
            self.add_check(check)

    def add_check(self, check) -> None:
        """One receiver's check (manifest.Check), counted when its sync ended (in band) or
        once its manifest was read (out of band)."""
        st = self.stats
        with st.lock:
            st.checked += check.checked
            for reason, n in check.mismatched.items():
                st.mismatched[reason] += n

    def add_unchecked(self, reason: str, tensors: int) -> None:
        with self.stats.lock:
            self.stats.unchecked[reason] += tensors


# Series appear with the first sync of their side: a receiver-only process shows no send
# series, and the step share reads only the processes that synced inside a step (a rollout
# worker's 0 would dilute the trainer's share).
def _by_side(st: WeightStats, values: dict) -> list[Observation]:
    with st.lock:
        return [Observation(values[s], {"side": s}) for s in names.WEIGHT_SIDES if st.syncs[s]]


def _versions(st: WeightStats) -> list[Observation]:
    with st.lock:
        return [Observation(v, {"side": s}) for s, v in st.version.items()]


def _checked(st: WeightStats) -> list[Observation]:
    with st.lock:
        return [Observation(st.checked)] if st.syncs["receive"] else []


def _mismatched(st: WeightStats) -> list[Observation]:
    with st.lock:
        if not st.syncs["receive"]:
            return []
        return [Observation(n, {"reason": r}) for r, n in st.mismatched.items()]


def _step_seconds(st: WeightStats) -> list[Observation]:
    with st.lock:
        return [Observation(st.step_seconds)] if st.step_syncs else []
