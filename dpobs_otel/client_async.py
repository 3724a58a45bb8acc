"""The instrumented client's continuations for awaitable ops: a protocol method that returns
an awaitable (a coroutine function, or a plain function returning a coroutine) is measured
when awaited, in the task that awaits it, from the call to the awaited result; the same
bookkeeping as the synchronous path then runs on the result (client.py's *_done)."""
from __future__ import annotations

from inspect import isawaitable
from time import perf_counter
from types import GeneratorType

from . import names


class AwaitedOps:
    """Mixed into InstrumentedClient: each op's synchronous path hands its awaitable here."""

    async def _put_async(self, pending, t0, t1, sample_ids, partition_id, fields, tags):
        result, t2, _ = await self._settle("put", pending, t1)
        self._put_done(t0, t1, t2, sample_ids, partition_id, fields, tags)
        return result

    async def _clear_async(self, pending, t1, sample_ids, partition_id):
        result, t2, _ = await self._settle("clear", pending, t1)
        self._clear_done(t1, t2, sample_ids, partition_id)
        return result

    async def _read_async(self, op, fn, pending, retry, t0, t1, sample_ids, partition_id,
                          select_fields, kwargs, added):
        result, t2, mixed = await self._settle(op, pending, t1, retry)
        return self._read_done(op, fn, result, t0, t1, t2, sample_ids, partition_id,
                               select_fields, kwargs, added, mixed)

    async def _call_async(self, op, pending, t1, read_result, pid=None):
        result, t2, _ = await self._settle(op, pending, t1)
        return self._call_done(op, result, t1, t2, read_result, pid)

    async def awaiting(self, pending):
        """Await `pending`, an op whose measured path runs elsewhere (an adapter's worker
        thread counts it in flight): the calling task is exposed as for an awaited op."""
        return await self._cp.awaited(pending, busy=False, failed=self._cp_failed)

    def _cp_failed(self, exc) -> None:
        self._tel.internal_error(names.COMPONENT_CRITICAL_PATH, exc)

    async def _settle(self, op, pending, t1, retry=None):
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


# Result types seen not to be awaitable: the check on every op is then one set lookup.
# A generator is never cached: a generator-based coroutine is awaitable by its code's flags.
NOT_AWAITABLE: set = set()


def is_awaitable(result) -> bool:
    if isawaitable(result):
        return True
    if type(result) is not GeneratorType:
        NOT_AWAITABLE.add(type(result))
    return False
