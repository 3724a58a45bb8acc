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
from time import perf_counter

from ... import instruments, names
from ...shims.otel_histogram import ClassicRecord
from ...shims.otel_sdk import BoundRecord
from ...stats import OpStats
from .methods import Methods

MB = 1e6
PRUNE_EVERY = 4096  # puts held before the owned map is checked against Ray's references
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

    # -- the op path ------------------------------------------------------------------------
    def record(self, op: str, method, dt: float, keys: int, nbytes: int = 0,
               serialization: float = 0.0, error: str | None = None, owned=None) -> None:
        """One Ray op: its duration, keys, bytes (in the op's direction), the seconds of it
        spent serializing, its error type if it raised, and the object id it put (owned)."""
        t0 = perf_counter()
        key = (op, method)
        record = self._records.get(key) or self._bind(op, method)
        record(dt)
        if op in SERIALIZES and (serialization or error is None):
            self._ser_records[op](serialization)
        with self._lock:  # one lock per op: the numbers, the owned map, dpobs's own time
            s = self._ops.get(key)
            if s is None:
                s = self._ops[key] = OpStats()
            s.calls += 1
            s.seconds += dt
            s.keys += keys
            if op in READS:
                s.read_bytes += nbytes
            else:
                s.write_bytes += nbytes
            if error is not None:
                s.errors += 1
                ekey = (op, method, error)
                self._errors[ekey] = self._errors.get(ekey, 0) + 1
            if serialization:
                self._serialization[op] = self._serialization.get(op, 0.0) + serialization
            if owned is not None:
                self._owned[owned] = nbytes
                grown = len(self._owned) >= self._prune_at
            self._own_seconds += perf_counter() - t0
        if owned is not None and grown:  # a process nothing scrapes must not keep every put
            self._prune()

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
        from opentelemetry.metrics import Observation

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
        self._prune()
        with self._lock:
            return [Observation(sum(self._owned.values()))]

    def window(self) -> dict[str, float]:
        """`dpobs/ray/<op>/{seconds,calls,errors,mb,serialization_s}` since the last call
        (every op once used, summed over methods), dpobs's own time on them
        (`dpobs/ray/instrumentation_s`) and `dpobs/ray/owned_mb`."""
        now: dict[str, float] = {}
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
