"""The account of one process's Ray ops, kept beside the core's (never in it: a ray_get blocks
for the remote method's whole run, so Ray ops are not data-plane time; DESIGN.md says why).

Each op is one observation of the core's op duration histogram with attributes op and, where
known, method; its keys, bytes and errors join the core's counters at collection through
stats.accounts (observed.py), so Prometheus sees one family per quantity. The part of an op
spent in Ray's serializer is one observation of dpobs.ray.serialization.duration; the bytes
this process put and still references are dpobs_ray_owned_bytes. step_metrics() gets
`dpobs/ray/<op>/...` keys from window().
"""
from __future__ import annotations

import threading
import weakref
from time import perf_counter, sleep

from ... import instruments, names
from ...shims.otel_histogram import ClassicRecord
from ...shims.otel_sdk import BoundRecord
from ...stats import OpStats
from .methods import Methods

MB = 1e6
PRUNE_EVERY = 4096  # puts held before the owned map is checked against Ray's references
# Records are added up by a thread of the meter's every DRAIN_EVERY_S, CHUNK at a time (the
# GIL is given back between chunks), mostly while the program waits in Ray with the GIL
# released; past DRAIN_AT waiting (that thread starved) the op that finds them adds them up.
DRAIN_EVERY_S = 0.25
CHUNK = 256
DRAIN_AT = 1 << 14
# The direction of serialization work an op does, if any.
READS = frozenset(op for op, d in names.RAY_OPS.items() if d == "read")
SERIALIZES = {names.RAY_PUT: "serialize", names.RAY_CALL: "serialize",
              names.RAY_RETURN: "serialize", names.RAY_GET: "deserialize",
              names.RAY_ARGS: "deserialize"}


class RayMeter:
    def __init__(self, tel, lacking=()):
        self.tel = tel
        if lacking:  # counted once per process: bytes and the workers' side are left out
            tel.internal_error(names.COMPONENT_RAY_PRIVATE,
                               RuntimeError(f"Ray lacks {', '.join(lacking)}"))
        self.methods = Methods()
        self._lock = threading.Lock()
        self._drain_lock = threading.Lock()
        # ops recorded, not yet added up: record()'s arguments, in order (ops.py appends its
        # wrappers' records here itself, and drains at DRAIN_AT as record() does)
        self.pending: list[tuple] = []
        self._ops: dict[tuple, OpStats] = {}  # (op, method or None) -> totals
        self._errors: dict[tuple, int] = {}  # (op, method or None, error type) -> calls
        self._serialization: dict[str, float] = {}  # op -> seconds in Ray's serializer
        self._owned: dict[str, int] = {}  # object id (hex) -> size, of refs this process put
        self._prune_at = PRUNE_EVERY
        self._own_seconds = 0.0  # dpobs's own time on Ray ops (component "ray")
        self._records: dict[tuple, BoundRecord] = {}
        self._prev: dict[str, float] = {}
        self._serialization_hist = instruments.create(tel.meter, names.RAY_SERIALIZATION)
        instruments.create(tel.meter, names.RAY_OWNED, self._observe_owned,
                           instruments.exported(tel.internal_error))
        self._ser_records = {op: ClassicRecord(self._serialization_hist,
                                               {"op": op, "direction": d}, names.OP_BUCKETS,
                                               tel.internal_error)
                             for op, d in SERIALIZES.items()}
        with tel.stats.lock:
            tel.stats.accounts.append(self)
        threading.Thread(target=_add_up, args=(weakref.ref(self),), daemon=True,
                         name="dpobs-ray-account").start()

    # -- the op path ------------------------------------------------------------------------
    def record(self, op: str, method, dt: float, keys: int, nbytes: int = 0,
               serialization: float = 0.0, error: str | None = None, owned=None) -> None:
        """One Ray op: its duration, keys, bytes (in the op's direction), the seconds of it
        spent serializing, its error type if it raised, and the binary id of the object it
        put (owned). Kept as it is until the meter's thread, a collection or window() adds it
        up in a batch: run between Ray's own calls, on the op's way, the account's work cost
        several times what it costs run back to back (docs/development/performance.md)."""
        pending = self.pending
        pending.append((op, method, dt, keys, nbytes, serialization, error, owned))
        if len(pending) >= DRAIN_AT:
            self.drain()

    def drain(self, most: int | None = None) -> int:
        """Add the ops recorded so far (at most `most` of them) to the histograms and totals;
        returns how many are still waiting. Safe from any thread."""
        with self._drain_lock:
            t0 = perf_counter()
            n = len(self.pending)
            if most is not None:
                n = min(n, most)
            if not n:
                return 0
            batch = self.pending[:n]
            del self.pending[:n]  # one step under the GIL: appends meanwhile stay queued
            self._histograms(batch)
            with self._lock:
                grown = self._totals(batch)
                self._own_seconds += perf_counter() - t0
        if grown:  # a process nothing scrapes must not keep every put
            self._prune()
        return len(self.pending)

    def _histograms(self, batch) -> None:
        """The batch's op durations and serialization seconds into their histograms, grouped
        by attribute set (one bulk update of each serialization aggregation)."""
        durations, serialization = {}, {}
        for op, method, dt, _, _, seconds, error, _ in batch:
            durations.setdefault((op, method), []).append(dt)
            if op in SERIALIZES and (seconds or error is None):
                serialization.setdefault(op, []).append(seconds)
        for key, values in durations.items():
            record = self._records.get(key) or self._bind(*key)
            for v in values:
                record(v)
        for op, values in serialization.items():
            self._ser_records[op].many(values)

    def _totals(self, batch) -> bool:
        """Adds `batch` to the totals (under self._lock); is the owned map due a prune?"""
        ops, owned, error_type = self._ops, None, self.tel.stats.error_type
        for op, method, dt, keys, nbytes, serialization, error, owned_id in batch:
            key = (op, method)
            s = ops.get(key)
            if s is None:
                s = ops[key] = OpStats()
            s.calls += 1
            s.seconds += dt
            s.keys += keys
            if op in READS:
                s.read_bytes += nbytes
            else:
                s.write_bytes += nbytes
            if error is not None:
                s.errors += 1
                ekey = (op, method, error_type(error))
                self._errors[ekey] = self._errors.get(ekey, 0) + 1
            if serialization:
                self._serialization[op] = self._serialization.get(op, 0.0) + serialization
            if owned_id is not None:
                owned = self._owned
                owned[owned_id.hex()] = nbytes
        return owned is not None and len(owned) >= self._prune_at

    def _bind(self, op, method) -> BoundRecord:
        attrs = {"op": op} if method is None else {"op": op, names.RAY_METHOD: method}
        record = self._records[(op, method)] = BoundRecord(self.tel.op_duration, attrs,
                                                           self.tel.internal_error)
        return record

    def _prune(self) -> None:
        """Forget the objects this process no longer references (its core worker's table),
        and prune again once as many more are held."""
        from ...shims.ray_private import referenced
        live = referenced()
        with self._lock:
            if live is not None:
                for object_id in [i for i in self._owned if i not in live]:
                    del self._owned[object_id]
            self._prune_at = max(PRUNE_EVERY, 2 * len(self._owned))

    # -- collection -------------------------------------------------------------------------
    def observe(self, instrument: str) -> list:
        """The Observations of one of the core's shared instruments (stats.accounts). The SDK
        calls these callbacks before it collects its histograms, so the drain here puts every
        op recorded so far into both."""
        from opentelemetry.metrics import Observation
        self.drain()

        def attrs(op, method, **more):
            out = {"op": op, **more}
            if method is not None:
                out[names.RAY_METHOD] = method
            return out

        with self._lock:
            if instrument == names.OP_ERRORS:
                return [Observation(n, attrs(op, m, error_type=et))
                        for (op, m, et), n in self._errors.items()]
            if instrument == names.KEYS:
                return [Observation(s.keys, attrs(op, m)) for (op, m), s in self._ops.items()]
            if instrument == names.INSTR_TIME:
                return [Observation(self._own_seconds, {"component": names.COMPONENT_RAY})]
            if instrument == names.TRANSFERRED:
                return [Observation(s.read_bytes + s.write_bytes,
                                    attrs(op, m, direction=names.RAY_OPS[op]))
                        for (op, m), s in self._ops.items() if names.RAY_OPS[op]]
        return []

    def _observe_owned(self) -> list:
        from opentelemetry.metrics import Observation
        self.drain()
        self._prune()
        with self._lock:
            return [Observation(sum(self._owned.values()))]

    def window(self) -> dict[str, float]:
        """`dpobs/ray/<op>/{seconds,calls,errors,mb,serialization_s}` since the last call
        (every op once used, summed over methods), dpobs's own time on them
        (`dpobs/ray/instrumentation_s`) and `dpobs/ray/owned_mb`."""
        now: dict[str, float] = {}
        self.drain()
        with self._lock:
            for (op, _), s in self._ops.items():
                p = f"dpobs/ray/{op}/"
                for key, v in (("seconds", s.seconds), ("calls", s.calls),
                               ("errors", s.errors),
                               ("mb", (s.read_bytes + s.write_bytes) / MB)):
                    now[p + key] = now.get(p + key, 0) + v
                if op in SERIALIZES:
                    now[p + "serialization_s"] = self._serialization.get(op, 0.0)
            owned = sum(self._owned.values()) / MB
            now["dpobs/ray/instrumentation_s"] = self._own_seconds
        prev, self._prev = self._prev, now
        out = {k: v - prev.get(k, 0) for k, v in now.items()}
        out["dpobs/ray/owned_mb"] = owned
        return out


def _add_up(meter_ref) -> None:
    """The meter's thread: adds up its records, CHUNK at a time, while the meter lives (held
    weakly: the thread never keeps a meter alive)."""
    while True:
        sleep(DRAIN_EVERY_S)
        while True:
            meter = meter_ref()
            if meter is None:
                return
            try:
                waiting = meter.drain(CHUNK)
            except Exception as exc:  # dpobs's own failure: counted, the thread goes on
                meter.tel.internal_error(names.COMPONENT_RAY, exc)
                waiting = 0
            del meter
            if not waiting:
                break
            sleep(0)  # the GIL back to the program between chunks
