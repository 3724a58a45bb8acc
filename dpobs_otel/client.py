"""The instrumented data-plane client: the protocol's ops measured, everything else passed
through. Inner exceptions propagate untouched; dpobs's own failures are swallowed and counted.

Any protocol method may return an awaitable (a coroutine function, or a plain function
returning a coroutine): the op is then measured when awaited, from the call to the awaited
result, its bytes and guard checks those of that result (client_async.py)."""
from __future__ import annotations

from functools import partial
from time import perf_counter

from . import names
from .client_async import NOT_AWAITABLE, AwaitedOps, is_awaitable
from .occupancy import TAGS, UNSIZED, Occupancy, Reconciling
from .recording import Recording
from .sizing import encoded_size, field_nbytes, is_payload, payload_nbytes


class InstrumentedClient(AwaitedOps, Reconciling, Recording):
    def __init__(self, inner, tel):
        self._inner = inner
        self._tel = tel
        self._stats = tel.stats
        self._guard = tel.guard
        self._row_age = getattr(tel, "row_age", None)  # rowage.RowAge, or None (off)
        if self._guard is not None:  # where the guard's hooks run (guard/pool.py)
            from .guard import pool
            self._pool = pool
        self._records = tel.op_records  # op -> bound.BoundRecord
        self._cp = tel.critical
        self._tracer = tel.tracer  # None unless tracing is on: one `is not None` per op
        self._occ = Occupancy()
        self._rows_since_reconcile = 0
        self._reconcile_rows = tel.settings.reconcile_rows
        self._reconciling = False  # one reconciliation at a time (store clients may not be
        # thread-safe), on the thread of the put that crossed the throttle
        # Optional inner hook: which ids a short read's rows belong to (stores that drop
        # missing keys silently); see _aligned_ids.
        self._returned_ids = getattr(inner, "returned_sample_ids", None)
        self._overlaps_guard = bool(getattr(inner, "overlaps_guard", False))
        with self._stats.lock:
            self._stats.occupancies.append(self._occ)

    def __getattr__(self, name):  # everything outside the protocol, untouched
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"InstrumentedClient({self._inner!r})"

    @property
    def inner(self):
        return self._inner

    # -- the protocol -----------------------------------------------------------------
    def put_samples(self, sample_ids, partition_id, fields=None, tags=None, **kwargs):
        # Row age: the stamp column rides beside the guard's digests (sizing sees `fields`).
        stored = fields if self._row_age is None else self._safely(
            names.COMPONENT_ROW_AGE, self._row_age.stamp, fields, fallback=fields)
        t0 = perf_counter()
        if self._guard is not None and fields is not None:
            pending = self._pool.submit(self._guarded, self._guard.before_put, stored,
                                        sample_ids, partition_id, stored, where=stored)
            if self._overlaps_guard:  # the store awaits it after I/O that needs no digests
                kwargs["pending_fields"] = pending
            else:
                stored = pending.result()
        put = self._inner.put_samples  # looked up outside the interval, as _call's fn is
        step, t1 = self._cp_start()
        try:
            result = put(sample_ids, partition_id, stored, tags, **kwargs)
        except BaseException as exc:
            self.failed_call("put", exc, t1, step)
            raise
        t2 = perf_counter()
        if type(result) not in NOT_AWAITABLE and is_awaitable(result):
            self._cp_end(step, t1, t1)  # the op is in flight once awaited
            return self._put_async(result, t0, t1, sample_ids, partition_id, fields, tags)
        self._cp_end(step, t1, t2)
        self._put_done(t0, t1, t2, sample_ids, partition_id, fields, tags)
        return result

    def _put_done(self, t0, t1, t2, sample_ids, partition_id, fields, tags) -> None:
        try:  # bytes in a guard of their own (see _sized), inlined on the hottest path
            sizes = _put_sizes(fields, tags)
        except Exception as exc:
            self._tel.internal_error("sizing", exc)
            sizes = {UNSIZED: 0}
        try:
            n = len(sample_ids)
            self.record_op("put", t2 - t1, n, write=sum(sizes.values()),
                       occupy=(partition_id, sample_ids, sizes),
                       overhead=t1 - t0 if self._guard is None else 0.0, t_end=t2)
            if self._tracer is not None:
                self._safely(names.COMPONENT_TRACE, self._tracer.op, "put", t1, t2,
                             partition_id, n, sum(sizes.values()))
            self._rows_since_reconcile += n
            if self._rows_since_reconcile >= self._reconcile_rows:
                self._safely(names.COMPONENT_RECONCILE, self._reconcile)
        except Exception as exc:
            self._tel.internal_error(names.COMPONENT_CLIENT, exc)

    def _sized(self, default, fn, *args):
        """Payload bytes in a guard of their own: a sizing failure is counted
        (component=sizing) and leaves the op's time, count and keys intact."""
        try:
            return fn(*args)
        except Exception as exc:
            self._tel.internal_error("sizing", exc)
            return default

    def get_samples(self, sample_ids, partition_id, select_fields=None, **kwargs):
        return self._read("get", self._inner.get_samples, sample_ids, partition_id,
                          select_fields, kwargs)

    def get_data(self, *args, **kwargs):
        # The reference store's get_data reads like get_samples; other clients' forms are
        # measured generically.
        if len(args) >= 2 and isinstance(args[0], list) and isinstance(args[1], str):
            select = args[2] if len(args) > 2 else kwargs.pop("select_fields", None)
            return self._read("get_data", self._inner.get_data, args[0], args[1], select,
                              kwargs)
        return self._call("get_data", self._inner.get_data, args, kwargs, read_result=True)

    def clear_samples(self, sample_ids, partition_id, **kwargs):
        clear = self._inner.clear_samples  # looked up outside the interval, as _call's fn is
        step, t1 = self._cp_start()
        try:
            result = clear(sample_ids, partition_id, **kwargs)
        except BaseException as exc:
            self.failed_call("clear", exc, t1, step)
            raise
        t2 = perf_counter()
        if type(result) not in NOT_AWAITABLE and is_awaitable(result):
            self._cp_end(step, t1, t1)  # the op is in flight once awaited
            return self._clear_async(result, t1, sample_ids, partition_id)
        self._cp_end(step, t1, t2)
        self._clear_done(t1, t2, sample_ids, partition_id)
        return result

    def _clear_done(self, t1, t2, sample_ids, partition_id) -> None:
        # The guard has nothing to release: its digests live beside the rows, in the store.
        n = self._safely(names.COMPONENT_OCCUPANCY, self._released, partition_id, sample_ids,
                         fallback=0 if sample_ids is None else len(sample_ids))
        try:
            self.record_op("clear", t2 - t1, n, t_end=t2)
            if self._tracer is not None:
                self._safely(names.COMPONENT_TRACE, self._tracer.op, "clear", t1, t2,
                             partition_id, n, 0)
        except Exception as exc:
            self._tel.internal_error(names.COMPONENT_CLIENT, exc)

    def _released(self, partition_id, sample_ids) -> int:
        """Occupancy: a clear's keys released; how many (all of a partition's: None)."""
        with self._stats.lock:
            n = len(sample_ids) if sample_ids is not None else len(self._occ.live(partition_id))
            self._occ.release(partition_id, sample_ids)
        return n

    def list_sample_ids(self, partition_id, *args, **kwargs):
        return self._call("list", self._inner.list_sample_ids, (partition_id, *args), kwargs)

    def register_partition(self, *args, **kwargs):
        return self._call("register", self._inner.register_partition, args, kwargs)

    def claim_meta(self, *args, **kwargs):
        return self._call("claim_meta", self._inner.claim_meta, args, kwargs)

    # -- measurement ------------------------------------------------------------------
    def _read(self, op, fn, sample_ids, partition_id, select_fields, kwargs):
        t0 = perf_counter()
        guard = self._guard
        select, added, mixed = select_fields, False, False
        if guard is not None:
            select = self._guarded(guard.before_get, select_fields, select_fields)
        if self._row_age is not None:
            select = self._safely(names.COMPONENT_ROW_AGE, self._row_age.select, select,
                                  fallback=select)
        # Digest or stamp columns were asked for by name (compared only when a hook ran).
        added = select is not select_fields and select != select_fields
        step, t1 = self._cp_start()
        try:
            try:
                result = fn(sample_ids, partition_id, select, **kwargs)
            except KeyError:
                if not added:
                    raise
                # Some rows carry no digest (written without the guard): read what the
                # caller asked for; the guard then fetches the digests the other rows have.
                mixed = True
                result = fn(sample_ids, partition_id, select_fields, **kwargs)
        except BaseException as exc:
            self.failed_call(op, exc, t1, step)
            raise
        t2 = perf_counter()
        if type(result) not in NOT_AWAITABLE and is_awaitable(result):
            self._cp_end(step, t1, t1)  # the op is in flight once awaited
            retry = (partial(fn, sample_ids, partition_id, select_fields, **kwargs) if added
                     else None)
            return self._read_async(op, fn, result, retry, t0, t1, sample_ids, partition_id,
                                    select_fields, kwargs, added)
        self._cp_end(step, t1, t2)
        return self._read_done(op, fn, result, t0, t1, t2, sample_ids, partition_id,
                               select_fields, kwargs, added, mixed)

    def _read_done(self, op, fn, result, t0, t1, t2, sample_ids, partition_id, select_fields,
                   kwargs, added, mixed):
        guard = self._guard
        if self._row_age is not None:  # ages observed, the stamp column dropped
            result = self._safely(
                names.COMPONENT_ROW_AGE, self._row_age.observe, op, result,
                lambda rows, cols: fn(rows, partition_id, cols, **kwargs), sample_ids, mixed,
                on_fail=self._row_age.unstamped)
        if (guard is not None or self._returned_ids is not None) and is_payload(result):
            # Only a TensorDict is checked: anything else goes back untouched.
            result = self._checked(fn, partition_id, kwargs, sample_ids, select_fields,
                                   result, added, mixed)
        t3 = perf_counter()
        nbytes, missing = self._read_size(result, sample_ids)
        try:
            self.record_op(op, t2 - t1, len(sample_ids), read=nbytes, missing=missing,
                           overhead=t1 - t0 if guard is None else 0.0, t_end=t3)
            if self._tracer is not None:
                self._safely(names.COMPONENT_TRACE, self._tracer.op, op, t1, t2, partition_id,
                             len(sample_ids), nbytes)
        except Exception as exc:
            self._tel.internal_error("client", exc)
        return result

    def _checked(self, fn, partition_id, kwargs, sample_ids, select_fields, result, added,
                 mixed):
        """A read's TensorDict after the guard: ids aligned, digests recovered and checked."""
        guard = self._guard
        ids = sample_ids
        if self._returned_ids is not None:
            ids = self._aligned_ids(sample_ids, partition_id, result)
        if mixed and guard is not None:  # its digest-only reads are billed to component=guard
            result = self._guarded(
                guard.recover_digests, result,
                lambda rows, cols: fn(rows, partition_id, cols, **kwargs),
                ids, select_fields, result)
        if guard is not None:  # on_fail: a full read returns any digests
            result = self._pool.run(partial(self._guarded, on_fail=self._strip),
                                    guard.after_get, None, ids, partition_id, result,
                                    select_fields, added or select_fields is None,
                                    where=result)
        return result

    def _read_size(self, result, sample_ids) -> tuple[int, int]:
        """(bytes, rows missing) of a read; never raises. A result that is not a TensorDict
        (None, a dict, a list, a generator) is never iterated: 0 bytes, nothing missing, and
        one error of component=client, since the store broke the protocol."""
        if not is_payload(result):
            self._tel.internal_error("client", TypeError(
                f"read returned {type(result).__name__}, not a TensorDict"))
            return 0, 0
        try:  # bytes in a guard of their own (see _sized), inlined on the hot path
            nbytes = payload_nbytes(result)
        except Exception as exc:
            self._tel.internal_error("sizing", exc)
            nbytes = 0
        try:
            n = len(sample_ids)
            return nbytes, max(n - len(result), 0) if result.batch_dims else 0
        except Exception as exc:
            self._tel.internal_error("client", exc)
            return nbytes, 0

    def _aligned_ids(self, sample_ids, partition_id, result):
        """A read returned fewer rows than ids: ask the inner which ids they are, so the guard
        salts each row with its own id. Billed to component=adapter; never raises."""
        try:
            if not result.batch_dims or len(result) >= len(sample_ids):
                return sample_ids
        except Exception:
            return sample_ids
        t = perf_counter()
        try:
            ids = self._returned_ids(sample_ids, partition_id, result)
            return sample_ids if ids is None else ids
        except Exception as exc:
            self._tel.internal_error("adapter", exc)
            return sample_ids
        finally:
            self._stats.add_time("adapter", perf_counter() - t)

    def _call(self, op, fn, args, kwargs, read_result=False):
        pid = None if self._tracer is None else self._tracer.partition_of(args, kwargs)
        step, t1 = self._cp_start()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self.failed_call(op, exc, t1, step)
            raise
        t2 = perf_counter()
        if type(result) not in NOT_AWAITABLE and is_awaitable(result):
            self._cp_end(step, t1, t1)  # the op is in flight once awaited
            return self._call_async(op, result, t1, read_result, pid)
        self._cp_end(step, t1, t2)
        return self._call_done(op, result, t1, t2, read_result, pid)

    def _call_done(self, op, result, t1, t2, read_result, pid=None):
        read = self._sized(0, payload_nbytes, result) if read_result else 0
        try:
            keys = len(result) if isinstance(result, (list, tuple, set, dict)) else 0
            self.record_op(op, t2 - t1, keys, read=read, t_end=t2)
            if self._tracer is not None:
                self._safely(names.COMPONENT_TRACE, self._tracer.op, op, t1, t2, pid, keys,
                             read)
        except Exception as exc:
            self._tel.internal_error("client", exc)
        return result

    def _guarded(self, fn, fallback, *args, on_fail=None):
        """Run a guard hook, billing its time to component=guard; never raises."""
        t = perf_counter()
        try:
            return fn(*args)
        except Exception as exc:
            self._tel.internal_error("guard", exc)
            if on_fail is not None:
                return on_fail(args[2])
            return fallback
        finally:
            self._stats.add_time("guard", perf_counter() - t)

    def _strip(self, result):
        try:
            from .guard import strip_digests  # the guard is loaded: this client has one
            return strip_digests(result)
        except Exception as exc:
            self._tel.internal_error("guard", exc)
            return result


def _put_sizes(fields, tags) -> dict:
    sizes = field_nbytes(fields)
    if tags:
        sizes[TAGS] = encoded_size(tags)
    return sizes or {UNSIZED: 0}

