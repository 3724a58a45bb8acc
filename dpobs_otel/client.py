"""The instrumented data-plane client: the protocol's ops measured, everything else passed
through. Inner exceptions propagate untouched; dpobs's own failures are swallowed and counted.
Each op's timing and bookkeeping are its Account's (account.py); this class adds what only
the protocol's ops have: payload sizing, the wire guard, row age and spans.

Any protocol method may return an awaitable (a coroutine function, or a plain function
returning a coroutine): the op is then measured when awaited, in the task that awaits it,
from the call to the awaited result, its bytes and guard checks those of that result."""
from __future__ import annotations

from functools import partial
from time import perf_counter

from . import names
from .account import Account
from .occupancy import TAGS, UNSIZED
from .sizing import encoded_size, field_nbytes, is_payload, payload_nbytes


class Read:
    """One read in progress: what the caller asked for and what dpobs added to it."""

    __slots__ = ("op", "fn", "sample_ids", "partition_id", "asked", "select", "kwargs",
                 "mixed", "t0")

    def __init__(self, op, fn, sample_ids, partition_id, asked, kwargs, t0):
        self.op, self.fn, self.kwargs, self.t0 = op, fn, kwargs, t0
        self.sample_ids, self.partition_id = sample_ids, partition_id
        self.asked = self.select = asked  # the caller's select_fields; what the store is asked
        self.mixed = False  # some rows lacked the added columns: read as asked, then fixed up

    @property
    def added(self) -> bool:
        """Digest or stamp columns were asked for by name (compared only when a hook ran)."""
        return self.select is not self.asked and self.select != self.asked

    def fetch(self):
        """The store's read, retried as the caller asked when added columns are missing."""
        try:
            return self.fn(self.sample_ids, self.partition_id, self.select, **self.kwargs)
        except KeyError:
            if not self.added:
                raise
            self.mixed = True
            return self.as_asked()

    def as_asked(self):
        return self.fn(self.sample_ids, self.partition_id, self.asked, **self.kwargs)

    def rows(self, rows, cols):
        """Some of the read's rows, some columns (the guard's and row age's follow-ups)."""
        return self.fn(rows, self.partition_id, cols, **self.kwargs)


class InstrumentedClient:
    def __init__(self, inner, tel):
        self._inner = inner
        self._tel = tel
        self._acct = Account(tel, inner)
        self._guard = tel.guard
        self._row_age = getattr(tel, "row_age", None)  # rowage.RowAge, or None (off)
        if self._guard is not None:  # where the guard's hooks run (guard/pool.py)
            from .guard import pool
            self._pool = pool
        # Optional inner hook: which ids a short read's rows belong to (stores that drop
        # missing keys silently); see _aligned_ids.
        self._returned_ids = getattr(inner, "returned_sample_ids", None)
        self._overlaps_guard = bool(getattr(inner, "overlaps_guard", False))

    def __getattr__(self, name):  # everything outside the protocol, untouched
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"InstrumentedClient({self._inner!r})"

    @property
    def inner(self):
        return self._inner

    def awaiting(self, pending):
        """Await `pending`, an op this client measures elsewhere (Account.awaiting)."""
        return self._acct.awaiting(pending)

    # -- the protocol -----------------------------------------------------------------
    def put_samples(self, sample_ids, partition_id, fields=None, tags=None, **kwargs):
        # Row age: the stamp column rides beside the guard's digests (sizing sees `fields`).
        stored = fields if self._row_age is None else self._acct.safely(
            names.COMPONENT_ROW_AGE, self._row_age.stamp, fields, fallback=fields)
        t0 = perf_counter()
        if self._guard is not None and fields is not None:
            pending = self._pool.submit(self._guarded, self._guard.before_put, stored,
                                        sample_ids, partition_id, stored, where=stored)
            if self._overlaps_guard:  # the store awaits it after I/O that needs no digests
                kwargs["pending_fields"] = pending
            else:
                stored = pending.result()
        result, t1, t2 = self._acct.call("put", self._inner.put_samples,
                                         (sample_ids, partition_id, stored, tags), kwargs)
        if t2 is None:
            return self._put_async(result, t0, t1, sample_ids, partition_id, fields, tags)
        self._put_done(t0, t1, t2, sample_ids, partition_id, fields, tags)
        return result

    async def _put_async(self, pending, t0, t1, sample_ids, partition_id, fields, tags):
        result, t2, _ = await self._acct.settle("put", pending, t1)
        self._put_done(t0, t1, t2, sample_ids, partition_id, fields, tags)
        return result

    def _put_done(self, t0, t1, t2, sample_ids, partition_id, fields, tags) -> None:
        try:  # bytes in a guard of their own (see _sized), inlined on the hottest path
            sizes = _put_sizes(fields, tags)
        except Exception as exc:
            self._tel.internal_error("sizing", exc)
            sizes = {UNSIZED: 0}
        acct = self._acct
        try:
            n = len(sample_ids)
            acct.record_op("put", t2 - t1, n, write=sum(sizes.values()),
                           occupy=(partition_id, sample_ids, sizes),
                           overhead=t1 - t0 if self._guard is None else 0.0, t_end=t2)
            if acct.tracer is not None:
                acct.trace("put", t1, t2, partition_id, n, sum(sizes.values()))
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
        result, t1, t2 = self._acct.call("clear", self._inner.clear_samples,
                                         (sample_ids, partition_id), kwargs)
        if t2 is None:
            return self._clear_async(result, t1, sample_ids, partition_id)
        self._clear_done(t1, t2, sample_ids, partition_id)
        return result

    async def _clear_async(self, pending, t1, sample_ids, partition_id):
        result, t2, _ = await self._acct.settle("clear", pending, t1)
        self._clear_done(t1, t2, sample_ids, partition_id)
        return result

    def _clear_done(self, t1, t2, sample_ids, partition_id) -> None:
        # The guard has nothing to release: its digests live beside the rows, in the store.
        acct = self._acct
        n = acct.safely(names.COMPONENT_OCCUPANCY, acct.release, partition_id, sample_ids,
                        fallback=0 if sample_ids is None else len(sample_ids))
        try:
            acct.record_op("clear", t2 - t1, n, t_end=t2)
            if acct.tracer is not None:
                acct.trace("clear", t1, t2, partition_id, n, 0)
        except Exception as exc:
            self._tel.internal_error(names.COMPONENT_CLIENT, exc)

    def list_sample_ids(self, partition_id, *args, **kwargs):
        return self._call("list", self._inner.list_sample_ids, (partition_id, *args), kwargs)

    def register_partition(self, *args, **kwargs):
        return self._call("register", self._inner.register_partition, args, kwargs)

    def claim_meta(self, *args, **kwargs):
        return self._call("claim_meta", self._inner.claim_meta, args, kwargs)

    # -- measurement ------------------------------------------------------------------
    def _read(self, op, fn, sample_ids, partition_id, select_fields, kwargs):
        rd = Read(op, fn, sample_ids, partition_id, select_fields, kwargs, perf_counter())
        if self._guard is not None:
            rd.select = self._guarded(self._guard.before_get, rd.select, rd.select)
        if self._row_age is not None:
            rd.select = self._acct.safely(names.COMPONENT_ROW_AGE, self._row_age.select,
                                          rd.select, fallback=rd.select)
        result, t1, t2 = self._acct.call(op, rd.fetch, (), {})
        if t2 is None:
            return self._read_async(rd, result, t1)
        return self._read_done(rd, result, t1, t2)

    async def _read_async(self, rd, pending, t1):
        retry = rd.as_asked if rd.added else None
        result, t2, rd.mixed = await self._acct.settle(rd.op, pending, t1, retry)
        return self._read_done(rd, result, t1, t2)

    def _read_done(self, rd, result, t1, t2):
        acct = self._acct
        if self._row_age is not None:  # ages observed, the stamp column dropped
            result = acct.safely(names.COMPONENT_ROW_AGE, self._row_age.observe, rd.op,
                                 result, rd.rows, rd.sample_ids, rd.mixed,
                                 on_fail=self._row_age.unstamped)
        if (self._guard is not None or self._returned_ids is not None) and is_payload(result):
            # Only a TensorDict is checked: anything else goes back untouched.
            result = self._checked(rd, result)
        t3 = perf_counter()
        nbytes, missing = self._read_size(result, rd.sample_ids)
        try:
            n = len(rd.sample_ids)
            acct.record_op(rd.op, t2 - t1, n, read=nbytes, missing=missing,
                           overhead=t1 - rd.t0 if self._guard is None else 0.0, t_end=t3)
            if acct.tracer is not None:
                acct.trace(rd.op, t1, t2, rd.partition_id, n, nbytes)
        except Exception as exc:
            self._tel.internal_error("client", exc)
        return result

    def _checked(self, rd, result):
        """A read's TensorDict after the guard: ids aligned, digests recovered and checked."""
        guard = self._guard
        ids = rd.sample_ids
        if self._returned_ids is not None:
            ids = self._aligned_ids(rd.sample_ids, rd.partition_id, result)
        if rd.mixed and guard is not None:  # its digest-only reads are billed to component=guard
            result = self._guarded(guard.recover_digests, result, rd.rows, ids, rd.asked,
                                   result)
        if guard is not None:  # on_fail: a full read returns any digests
            result = self._pool.run(partial(self._guarded, on_fail=self._strip),
                                    guard.after_get, None, ids, rd.partition_id, result,
                                    rd.asked, rd.added or rd.asked is None, where=result)
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
            self._tel.stats.add_time("adapter", perf_counter() - t)

    def _call(self, op, fn, args, kwargs, read_result=False):
        tracer = self._acct.tracer
        pid = None if tracer is None else tracer.partition_of(args, kwargs)
        result, t1, t2 = self._acct.call(op, fn, args, kwargs)
        if t2 is None:
            return self._call_async(op, result, t1, read_result, pid)
        return self._call_done(op, result, t1, t2, read_result, pid)

    async def _call_async(self, op, pending, t1, read_result, pid):
        result, t2, _ = await self._acct.settle(op, pending, t1)
        return self._call_done(op, result, t1, t2, read_result, pid)

    def _call_done(self, op, result, t1, t2, read_result, pid=None):
        read = self._sized(0, payload_nbytes, result) if read_result else 0
        acct = self._acct
        try:
            keys = len(result) if isinstance(result, (list, tuple, set, dict)) else 0
            acct.record_op(op, t2 - t1, keys, read=read, t_end=t2)
            if acct.tracer is not None:
                acct.trace(op, t1, t2, pid, keys, read)
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
            self._tel.stats.add_time("guard", perf_counter() - t)

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
