"""One op's account, kept the same way by every client kind: the instrumented client (sync
and awaited ops; TransferQueue's patched clients measure through it) and Mooncake's store
wrapper. An Account times the store's call on the critical path and records what it did:
its duration and counters, a failure by exception class or a store's error code, the keys
it left outstanding (occupancy) and, every so many rows put, the reconciliation against the
store's own listing. Each component on an op's way is guarded under its own name
(names.COMPONENT_*), so dpobs failing never reaches the user's call, and the store's own
exceptions and results pass through unchanged."""
from __future__ import annotations

from inspect import isawaitable
from time import perf_counter
from types import GeneratorType

from . import names
from .occupancy import Occupancy

# What a critical-path start that failed hands its end: nothing was begun, nothing to end.
_UNCOUNTED = object()

# Result types seen not to be awaitable: the check on every op is then one set lookup.
# A generator is never cached: a generator-based coroutine is awaitable by its code's flags.
NOT_AWAITABLE: set = set()


def is_awaitable(result) -> bool:
    if isawaitable(result):
        return True
    if type(result) is not GeneratorType:
        NOT_AWAITABLE.add(type(result))
    return False


class Account:
    """The account of one client's ops. `store`: the protocol client whose list_sample_ids
    the reconciliation diffs occupancy against (None: never reconciled)."""

    def __init__(self, tel, store=None):
        self.tel = tel
        self.tracer = tel.tracer  # None unless tracing is on: one `is not None` per op
        self._stats = tel.stats
        self._records = tel.op_records  # op -> shims.otel_histogram.BoundRecord
        self._cp = tel.critical
        self._occ = Occupancy()
        self._store = store
        self.reconcile_rows = (float("inf") if store is None
                               else tel.settings.reconcile_rows)
        self._rows_since_reconcile = 0
        self._reconciling = False  # one reconciliation at a time (store clients may not be
        # thread-safe), on the thread of the put that crossed the throttle
        with self._stats.lock:
            self._stats.occupancies.append(self._occ)

    # -- the call ---------------------------------------------------------------------
    def call(self, op, fn, args, kwargs):
        """fn(*args, **kwargs) timed on the critical path: (result, t1, t2). A raise is
        counted as a failed `op` and propagates unchanged. An awaitable result is an op in
        flight: t2 is None, and the task that awaits it measures it (settle)."""
        step, t1 = self._cp_start()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self.failed_call(op, exc, t1, step)
            raise
        t2 = perf_counter()
        if type(result) not in NOT_AWAITABLE and is_awaitable(result):
            self._cp_end(step, t1, t1)  # the op is in flight once awaited
            return result, t1, None
        self._cp_end(step, t1, t2)
        return result, t1, t2

    async def settle(self, op, pending, t1, retry=None):
        """Await an op's awaitable in the calling task: (result, end time, retried). `retry`
        makes a second awaitable when the first raised KeyError (a read asking for digest
        columns some rows lack). A failure is counted and propagates unchanged."""
        retried = False
        try:
            try:
                result = await self._cp.awaited(pending, failed=self._cp_failed)
            except KeyError:
                if retry is None:
                    raise
                retried = True
                result = await self._cp.awaited(retry(), failed=self._cp_failed)
        except BaseException as exc:
            self.record_failure(op, exc, perf_counter() - t1)
            raise
        return result, perf_counter(), retried

    async def awaiting(self, pending):
        """Await `pending`, an op whose measured path runs elsewhere (an adapter's worker
        thread counts it in flight): the calling task is exposed as for an awaited op."""
        return await self._cp.awaited(pending, busy=False, failed=self._cp_failed)

    # -- what an op did ---------------------------------------------------------------
    def record_op(self, op, dt, keys, read=0, write=0, missing=0, occupy=None, overhead=0.0,
                  t_end=0.0):
        """Count one call of `op`: every op path ends here. occupy: (partition, ids,
        {field: bytes}) a put left outstanding, its `keys` rows counted toward the next
        reconciliation; overhead: dpobs's time before the call."""
        try:
            self._records[op](dt)
        except Exception as exc:
            self._unbound_record(op, dt, exc)
        st = self._stats
        occupancy_failed = None
        with st.lock:
            s = st.ops.get(op) or st.op(op)  # the lookup inlined: it runs on every op
            s.calls += 1
            s.seconds += dt
            s.keys += keys
            s.read_bytes += read
            s.write_bytes += write
            s.missing += missing
            if dt > s.window_max:
                s.window_max = dt
            if occupy is not None:
                try:
                    self._occ.add(*occupy)
                except Exception as exc:  # counted once the lock is released
                    occupancy_failed = exc
            # Our own time: everything after the inner call returned (the lock block itself,
            # a fraction of a microsecond, is the part not counted).
            t = st.instr_seconds
            t["client"] = t.get("client", 0.0) + overhead + (perf_counter() - t_end)
        if occupancy_failed is not None:
            self.tel.internal_error(names.COMPONENT_OCCUPANCY, occupancy_failed)
        if occupy is not None:  # rows put: every reconcile_rows of them, reconcile
            self._rows_since_reconcile += keys
            if self._rows_since_reconcile >= self.reconcile_rows:
                self.safely(names.COMPONENT_RECONCILE, self.reconcile)

    def trace(self, op, t1, t2, partition, keys, nbytes) -> None:
        """The op's span (call only with tracing on: `if acct.tracer is not None`)."""
        self.safely(names.COMPONENT_TRACE, self.tracer.op, op, t1, t2, partition, keys,
                    nbytes)

    def record_error(self, op: str, error_type: str) -> None:
        """One more failed `op` whose call record_op already counted (a store that reports
        failure by return code, not exception)."""
        st = self._stats
        with st.lock:
            st.op(op).errors += 1
            key = (op, st.error_type(error_type))
            st.errors[key] = st.errors.get(key, 0) + 1

    def failed_call(self, op, exc, t1, step) -> None:
        """A synchronous call raised: its interval ends now; counted by exception class."""
        t2 = perf_counter()
        self._cp_end(step, t1, t2)
        self.record_failure(op, exc, t2 - t1)

    def record_failure(self, op, exc, dt):
        try:
            try:
                self._records[op](dt)
            except Exception as internal:
                self._unbound_record(op, dt, internal)
            st = self._stats
            key = (op, st.error_type(type(exc).__name__))
            with st.lock:
                s = st.op(op)
                s.calls += 1
                s.seconds += dt
                s.errors += 1
                if dt > s.window_max:
                    s.window_max = dt
                st.errors[key] = st.errors.get(key, 0) + 1
            if self.tracer is not None:
                self.safely(names.COMPONENT_TRACE, self.tracer.failed, op, dt, key[1])
        except Exception as internal:
            self.tel.internal_error(names.COMPONENT_CLIENT, internal)

    def _unbound_record(self, op, dt, exc) -> None:
        """The duration's fast path (shims/otel_histogram.py) raised: counted, and the SDK's
        own record takes the value, so the op's histogram still holds it."""
        self.tel.internal_error(names.COMPONENT_HISTOGRAM, exc)
        try:
            self.tel.op_duration.record(dt, {"op": op})
        except Exception:  # the SDK itself failing: already counted above
            pass

    # -- occupancy --------------------------------------------------------------------
    def release(self, partition_id: str, ids) -> int:
        """Occupancy: `ids` of a partition (None: all of it) are no longer outstanding;
        returns how many keys that was."""
        with self._stats.lock:
            n = len(ids) if ids is not None else len(self._occ.live(partition_id))
            self._occ.release(partition_id, ids)
        return n

    def live_keys(self, partition_id: str) -> set:
        """A copy of the keys this client holds outstanding in a partition."""
        with self._stats.lock:
            return set(self._occ.live(partition_id))

    def reconcile(self) -> None:
        """Drop keys another process cleared: diff what we hold against the store's listing.
        Ids put while the listing runs (other threads) are exempt: the listing may predate
        them. A reconciliation already running elsewhere makes this one a no-op."""
        st, occ = self._stats, self._occ
        with st.lock:
            if self._reconciling:
                return
            self._reconciling = True
            self._rows_since_reconcile = 0
            occ.recent = {}
            partitions = list(occ.parts)
        t = perf_counter()
        try:
            for pid in partitions:
                live = self._listing(pid)
                if live is None:
                    continue
                with st.lock:
                    stale = occ.live(pid) - live - occ.recent.get(pid, set())
                    occ.release(pid, stale)
        finally:
            with st.lock:
                occ.recent = None
                self._reconciling = False
            st.add_time("reconcile", perf_counter() - t)

    def _listing(self, pid) -> set | None:
        try:
            listing = self._store.list_sample_ids(pid)
            if isawaitable(listing):
                # A coroutine store: its listing cannot be awaited on the put's thread, so
                # this client does not reconcile (its occupancy counts only its own clears).
                getattr(listing, "close", lambda: None)()
                self.reconcile_rows = float("inf")
                return None
            return set(listing)
        except KeyError:
            return set()  # the partition itself is gone
        except Exception as exc:
            self.tel.internal_error("reconcile", exc)  # skipped; the next window retries
            return None

    # -- components on an op's way: each failure counted under its own name -------------
    def safely(self, component, fn, *args, fallback=None, on_fail=None):
        """fn(*args); if dpobs's own `fn` raises: counted (component), and `fallback`
        returned (or on_fail(args[1]): the store's result, cleaned)."""
        try:
            return fn(*args)
        except Exception as exc:
            self.tel.internal_error(component, exc)
            return fallback if on_fail is None else on_fail(args[1])

    def _cp_start(self):
        """The critical path's start: (step, t1); a failure leaves the op uncounted there."""
        try:
            return self._cp.start()
        except Exception as exc:
            self.tel.internal_error(names.COMPONENT_CRITICAL_PATH, exc)
            return _UNCOUNTED, perf_counter()

    def _cp_end(self, step, t1, t2) -> None:
        if step is _UNCOUNTED:
            return
        try:  # inlined rather than through safely: every op ends here
            self._cp.end(step, t1, t2)
        except Exception as exc:
            self.tel.internal_error(names.COMPONENT_CRITICAL_PATH, exc)

    def _cp_failed(self, exc) -> None:
        self.tel.internal_error(names.COMPONENT_CRITICAL_PATH, exc)
