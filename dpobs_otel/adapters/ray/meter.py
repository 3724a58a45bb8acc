"""The account of one process's Ray ops, kept beside the core's (never in it: a ray_get blocks
for the remote method's whole run, so a Ray op's whole duration is not data-plane time;
DESIGN.md says why). Its moving-data part is (locality.py says how it is found): each op's
data seconds (dpobs_ray_data_seconds_total), its bytes by where they were
(dpobs_ray_moved_bytes_total), remote bytes by source node (dpobs_ray_remote_bytes_total),
the fetch time of gets by locality (dpobs_ray_fetch_duration_seconds) and this process's
NodeID (dpobs_ray_node_info); step_metrics() adds the data seconds to data_plane_s.

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
from ...shims import ray_private
from ...shims.otel_sdk import BoundRecord
from ...stats import OpStats
from .locality import LOCAL, UNKNOWN, Where, fetch_locality
from .methods import Methods

# What a Ray lacking a locality name costs, by whether the location table is what it lacks.
LACKING_COSTS = {
    True: "every Ray op's locality is counted unknown and a get's data time as its "
          "deserialization",
    False: "an object not made yet when a get begins is counted unknown, and that get's "
           "data time as its deserialization",
}

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
# Ops whose whole duration is moving data (DESIGN.md's table); a read's is its tail, found
# by the op (locality.py), and a return's what this process sees of it (serialization).
ALL_DATA = frozenset({names.RAY_PUT, names.RAY_CALL})
OTHER = "other"  # from_node past RAY_FROM_NODE_LIMIT


class RayMeter:
    def __init__(self, tel, lacking=()):
        self.tel = tel
        self.critical = tel.critical  # the ops add their data part to it (ops._data_plane)
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
        self._moved: dict[tuple, int] = {}  # (op, method, locality) -> bytes
        self._remote: dict[tuple, int] = {}  # (op, from_node) -> bytes
        self._data: dict[tuple, float] = {}  # (op, method) -> data seconds
        self._from_nodes: set[str] = set()  # the NodeIDs named so far (RAY_FROM_NODE_LIMIT)
        self.where = Where(self._lacks_locality)
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
        self._fetch_hist = instruments.create(tel.meter, names.RAY_FETCH)
        self._fetch_records: dict[tuple, ClassicRecord] = {}
        on_error = instruments.exported(tel.internal_error)
        for name, observe in ((names.RAY_MOVED, self._observe_moved),
                              (names.RAY_REMOTE, self._observe_remote),
                              (names.RAY_DATA, self._observe_data),
                              (names.RAY_NODE, self._observe_node)):
            instruments.create(tel.meter, name, observe, on_error)
        with tel.stats.lock:
            tel.stats.accounts.append(self)
        threading.Thread(target=_add_up, args=(weakref.ref(self),), daemon=True,
                         name="dpobs-ray-account").start()

    def _lacks_locality(self, lacking) -> None:
        """Said once per process: this Ray cannot tell where objects were."""
        import logging
        logging.getLogger(__name__).warning(
            "dpobs: this Ray lacks %s: %s", ", ".join(lacking), LACKING_COSTS[
                ray_private.LOCALITY_NAMES[0] in lacking])
        self.tel.internal_error(names.COMPONENT_RAY_PRIVATE,
                                RuntimeError(f"Ray lacks {', '.join(lacking)}"))

    # -- the op path ------------------------------------------------------------------------
    def record(self, op: str, method, dt: float, keys: int, nbytes: int = 0,
               serialization: float = 0.0, error: str | None = None, owned=None,
               data: float | None = None, moved: tuple | None = None) -> None:
        """One Ray op: its duration, keys, bytes (in the op's direction), the seconds of it
        spent serializing, its error type if it raised, the binary id of the object it put
        (owned), its data seconds (None: the op's own rule, data_seconds()) and where its
        bytes were ((locality, bytes, from_node), ...; None: local for writes, unknown for
        reads). Kept as it is until the meter's thread, a collection or window() adds it
        up in a batch: run between Ray's own calls, on the op's way, the account's work cost
        several times what it costs run back to back (docs/development/performance.md)."""
        pending = self.pending
        pending.append((op, method, dt, keys, nbytes, serialization, error, owned, data,
                        moved))
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
        durations, serialization, fetch = {}, {}, {}
        for rec in batch:
            op, method, dt, _, nbytes, seconds, error = rec[:7]
            durations.setdefault((op, method), []).append(dt)
            if op in SERIALIZES and (seconds or error is None):
                serialization.setdefault(op, []).append(seconds)
            if op in READS and error is None:
                data, moved = _data_moved(rec)
                where = fetch_locality(moved) if moved else UNKNOWN
                fetch.setdefault((op, where), []).append(data)
        for key, values in durations.items():
            record = self._records.get(key) or self._bind(*key)
            for v in values:
                record(v)
        for op, values in serialization.items():
            self._ser_records[op].many(values)
        for key, values in fetch.items():
            record = self._fetch_records.get(key)
            if record is None:
                record = self._fetch_records[key] = ClassicRecord(
                    self._fetch_hist, {"op": key[0], names.RAY_LOCALITY: key[1]},
                    names.OP_BUCKETS, self.tel.internal_error)
            record.many(values)

    def _totals(self, batch) -> bool:
        """Adds `batch` to the totals (under self._lock); is the owned map due a prune?"""
        ops, owned, error_type = self._ops, None, self.tel.stats.error_type
        for rec in batch:
            op, method, dt, keys, nbytes, serialization, error, owned_id = rec[:8]
            key = (op, method)
            data, moved = _data_moved(rec)
            if data:
                self._data[key] = self._data.get(key, 0.0) + data
            if moved is not None and error is None:
                self._add_moved(op, method, moved)
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

    def _add_moved(self, op, method, moved) -> None:
        """An op's bytes by where they were, and remote ones by source node (bounded)."""
        for where, nbytes, node in moved:
            key = (op, method, where)
            self._moved[key] = self._moved.get(key, 0) + nbytes
            if node is not None:
                if node not in self._from_nodes:
                    if len(self._from_nodes) >= names.RAY_FROM_NODE_LIMIT:
                        node = OTHER
                    else:
                        self._from_nodes.add(node)
                rkey = (op, node)
                self._remote[rkey] = self._remote.get(rkey, 0) + nbytes

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

    def _observe_moved(self) -> list:
        from opentelemetry.metrics import Observation
        self.drain()
        with self._lock:
            return [Observation(n, _attrs(op, m, **{names.RAY_LOCALITY: w}))
                    for (op, m, w), n in self._moved.items()]

    def _observe_remote(self) -> list:
        from opentelemetry.metrics import Observation
        self.drain()
        with self._lock:
            return [Observation(n, {"op": op, names.RAY_FROM_NODE: node})
                    for (op, node), n in self._remote.items()]

    def _observe_data(self) -> list:
        from opentelemetry.metrics import Observation
        self.drain()
        with self._lock:
            return [Observation(s, _attrs(op, m)) for (op, m), s in self._data.items()]

    def _observe_node(self) -> list:
        """1 naming this process's NodeID, once Ray has told it (the process's own `node`
        label comes with every series, so rules join ray_node to node)."""
        from opentelemetry.metrics import Observation
        node = self.where.node or ""
        if not node:
            self.where.places([])  # reads the NodeID once Ray has connected
            node = self.where.node
        return [Observation(1, {names.RAY_NODE_LABEL: node})] if node else []

    def data_seconds(self) -> dict[str, float]:
        """op -> the data seconds of its ops so far (summed over methods): step_metrics()'s
        data_plane_s takes these, never a Ray op's whole duration."""
        self.drain()
        out: dict[str, float] = {}
        with self._lock:
            for (op, _), s in self._data.items():
                out[op] = out.get(op, 0.0) + s
        return out

    def _observe_owned(self) -> list:
        from opentelemetry.metrics import Observation
        self.drain()
        self._prune()
        with self._lock:
            return [Observation(sum(self._owned.values()))]

    def window(self) -> dict[str, float]:
        """`dpobs/ray/<op>/{seconds,calls,errors,mb,serialization_s,data_s}` since the last call
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
            for (op, _), seconds in self._data.items():
                key = f"dpobs/ray/{op}/data_s"
                now[key] = now.get(key, 0.0) + seconds
            owned = sum(self._owned.values()) / MB
            now["dpobs/ray/instrumentation_s"] = self._own_seconds
        prev, self._prev = self._prev, now
        out = {k: v - prev.get(k, 0) for k, v in now.items()}
        out["dpobs/ray/owned_mb"] = owned
        return out


def _attrs(op, method, **more) -> dict:
    out = {"op": op, **more}
    if method is not None:
        out[names.RAY_METHOD] = method
    return out


def _data_moved(rec) -> tuple:
    """(data seconds, moved) of a record, by the op's rule where the op left them out."""
    op, dt, nbytes, serialization, error = rec[0], rec[2], rec[4], rec[5], rec[6]
    data, moved = rec[8:10] if len(rec) > 8 else (None, None)
    if data is None:
        data = dt if op in ALL_DATA and error is None else serialization
    if moved is None and nbytes:
        moved = ((UNKNOWN if op in READS else LOCAL, nbytes, None),)
    return data, moved


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
