"""TransferQueue's client classes measured: the BatchMeta level verl's trainers use.

    TransferQueueClient            AsyncTransferQueueClient      op
    get_meta                       async_get_meta                claim_meta
    put                            async_put                     put        (bytes written)
    get_data                       async_get_data                get_data   (bytes read)
    clear_samples, clear_partition async_clear_samples, ...      clear

TransferQueueInstrumentor patches these methods on the classes; every measured call goes
through the core (`tel.instrument(...)`) like the kv_* functions, so timing, errors, bytes,
occupancy and the wire guard are the core's. Rows are named `<partition>/<global index>`,
the ids TransferQueue's controller gives them, so a reader in any process salts each row as
its writer did; the guard's digests ride in the rows' `custom_meta` (digests.py), which
get_meta hands back with the rows, so a claimed BatchMeta carries them to get_data.

Each measured call is measured once: the calls it makes into TransferQueue (and, in there,
TransferQueue's sync wrappers over the async methods) are marked as dpobs's own
(instrumentation.own_calls), as are the kv_* adapter's, and a patched method passes an own
call through. The mark is set by the runner that makes each call, on its thread: an awaited
call runs on a worker thread (run_in_executor, which a context variable does not cross) and
submits TransferQueue's coroutine from there (run_coroutine_threadsafe, whose task does take
the submitting thread's context along). Calls that TransferQueue's own modules make for the
user, its streaming dataset's get_meta and get_data for one, are the user's data-plane time
and are measured.

A put without metadata: TransferQueue's put first asks the controller for insert metadata;
here that lookup runs before the measured put (the rows' ids are needed up front), so the
put's time leaves it out.
"""
from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

from ..instrumentation import is_own_call, own
from .digests import (carries_tags, digest_columns, digests_to_tags, parser_kwargs,
                      strip_digest_tags)

SYNC_METHODS = ("get_meta", "put", "get_data", "clear_samples", "clear_partition")
ASYNC_METHODS = tuple("async_" + m for m in SYNC_METHODS)
ROWS = ""  # the one partition the core sees: row ids carry their own partition


def _ids(meta) -> list[str]:
    return [f"{p}/{g}" for p, g in zip(meta.partition_ids, meta.global_indexes)]


class _ClientPlane:
    """The data-plane protocol over one TransferQueue client object. `run(name, ...)` calls
    TransferQueue's own method `name` on it (sync, or the async one on the caller's loop)."""

    def __init__(self, client, digests: bool):
        self._client = client
        self._digests = digests
        self._local = threading.local()  # the runner of the call in flight on this thread
        self._fields: dict = {}  # partition -> a field this plane has put there (for listing)

    def claim_meta(self, *args, run, **kwargs):
        return run("get_meta", *args, **kwargs)

    def put_samples(self, sample_ids, partition_id, fields=None, tags=None, *, run, metadata,
                    partition=None, data_parser=None):
        if fields is not None and metadata is not None:
            fields, rows = digests_to_tags(fields, None, metadata.size,
                                           unrecorded=data_parser is not None,
                                           current=metadata.custom_meta)
            if rows is not None:
                # the caller's BatchMeta stays as it was (0.1.6's BatchMeta has no copy())
                metadata = (metadata.copy() if hasattr(metadata, "copy")
                            else copy.deepcopy(metadata))
                metadata.update_custom_meta(rows)
        out = run("put", fields, metadata, partition, **parser_kwargs(data_parser))
        if metadata is not None and fields is not None and len(fields.keys()):
            for p in set(metadata.partition_ids):
                self._fields.setdefault(p, next(iter(fields.keys())))
        if hasattr(out, "custom_meta"):
            out.custom_meta = strip_digest_tags(out.custom_meta)
        return out

    def get_data(self, sample_ids, partition_id, select_fields=None, *, run, metadata):
        out = run("get_data", metadata)
        if self._digests and metadata is not None:
            out = digest_columns(out, metadata.custom_meta)
        return out

    def clear_samples(self, sample_ids, partition_id, *, run, metadata=None, partition=None):
        if metadata is None:
            return run("clear_partition", partition)
        return run("clear_samples", metadata)

    def field_of(self, partition):
        return self._fields.get(partition)

    def list_sample_ids(self, partition_id):
        """The live rows of every partition this plane has put rows in (the core's
        reconciliation, every reconcile_rows rows put): a partition that no longer exists
        has none; one controller request per partition that does."""
        run = self._local.run
        live = set(run("get_partition_list"))
        return [f"{p}/{g}" for p in list(self._fields) if p in live
                for g in self.indexes(run, p, self._fields[p])]

    @staticmethod
    def indexes(run, partition, field) -> list:
        """A partition's global indexes: TransferQueue lists them per field (every row of
        the partition, whatever its production status)."""
        global_index, _ = run("get_production_status", [field], partition)
        return [] if global_index is None else global_index.tolist()


def _dispatch(name: str, measured, plane: _ClientPlane, run, a: dict):
    """One client call through the core, by method name (a: its bound arguments)."""
    plane._local.run = run
    if name == "get_meta":
        return measured.claim_meta(**a, run=run)
    if name == "put":
        meta, data = a["metadata"], a["data"]
        if meta is None and a["partition_id"] is not None and data is not None:
            meta = run("get_meta", data_fields=list(data.keys()), batch_size=data.batch_size[0],
                       partition_id=a["partition_id"], mode="insert")
        return measured.put_samples([] if meta is None else _ids(meta), ROWS, data, None,
                                    run=run, metadata=meta, partition=a["partition_id"],
                                    data_parser=a.get("data_parser"))  # none in 0.1.6
    if name == "get_data":
        return measured.get_data(_ids(a["metadata"]), ROWS, None, run=run,
                                 metadata=a["metadata"])
    if name == "clear_samples":
        return measured.clear_samples(_ids(a["metadata"]), ROWS, run=run,
                                      metadata=a["metadata"])
    pid = a["partition_id"]  # clear_partition: its rows, listed before the measured call
    field = plane.field_of(pid)
    ids = [] if field is None else [f"{pid}/{g}" for g in plane.indexes(run, pid, field)]
    return measured.clear_samples(ids, ROWS, run=run, partition=pid)


class ClientPatches:
    """Measured versions of the client classes' methods, installed and removed as a set."""

    def __init__(self, telemetry_of):
        from transfer_queue.client import AsyncTransferQueueClient, TransferQueueClient

        self._classes = (TransferQueueClient, AsyncTransferQueueClient)
        self._telemetry_of = telemetry_of  # () -> this process's Telemetry, or None
        self._sync = {m: getattr(TransferQueueClient, m) for m in SYNC_METHODS}
        self._async = {m: getattr(AsyncTransferQueueClient, m) for m in ASYNC_METHODS}
        self._extra = {m: getattr(TransferQueueClient, m)
                       for m in ("get_partition_list", "get_production_status")}
        self._measured = weakref.WeakKeyDictionary()  # client -> (pid, core client, plane)
        self._lock = threading.Lock()
        self._pool = None

    def install(self) -> None:
        for m, fn in self._sync.items():
            setattr(self._classes[0], m, self._wrapper(m, fn, awaited=False))
        for m, fn in self._async.items():
            setattr(self._classes[1], m, self._wrapper(m.removeprefix("async_"), fn, True))

    def uninstall(self) -> None:
        for m, fn in self._sync.items():
            setattr(self._classes[0], m, fn)
        for m, fn in self._async.items():
            setattr(self._classes[1], m, fn)

    def _core(self, client):
        pid = os.getpid()
        with self._lock:
            hit = self._measured.get(client)
            if hit is not None and hit[0] == pid:
                return hit[1], hit[2]
            tel = self._telemetry_of()
            if tel is None:
                return None, None
            plane = _ClientPlane(client, digests=carries_tags(tel))
            measured = tel.instrument(plane)
            self._measured[client] = (pid, measured, plane)
            return measured, plane

    def _wrapper(self, name, original, awaited: bool):
        """`original` measured. For an async method (awaited) a plain function returning a
        coroutine, so that whether the call is dpobs's own is read where it is called:
        TransferQueue's sync wrappers call the async methods on the caller's thread."""
        sig = inspect.signature(original)

        @functools.wraps(original)
        def measured(client, *args, **kwargs):
            core, plane = (None, None) if is_own_call() else self._core(client)
            if core is None:
                return original(client, *args, **kwargs)
            a = _arguments(sig, client, args, kwargs)
            if awaited:
                return self._awaited(name, core, plane, client, a)
            return _dispatch(name, core, plane, self._sync_runner(client), a)
        return measured

    async def _awaited(self, name, core, plane, client, a):
        # The core is synchronous: its measured path runs on a worker thread and submits
        # TransferQueue's coroutine back to the caller's loop, which is free while it awaits.
        loop = asyncio.get_running_loop()

        @own  # on the worker thread, which submits the coroutine: its task inherits the mark
        def run(method, *args, **kwargs):
            fn = self._async.get("async_" + method) or getattr(self._classes[1],
                                                                 "async_" + method)
            return asyncio.run_coroutine_threadsafe(fn(client, *args, **kwargs), loop).result()

        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(16, thread_name_prefix="dpobs-tq-client")
        # Exposure belongs to this coroutine's task, not to the worker thread.
        return await core.awaiting(loop.run_in_executor(
            self._pool, functools.partial(_dispatch, name, core, plane, run, a)))

    def _sync_runner(self, client):
        methods = {**self._sync, **self._extra}
        return own(lambda method, *args, **kwargs: methods[method](client, *args, **kwargs))


def _arguments(sig, client, args, kwargs) -> dict:
    bound = sig.bind(client, *args, **kwargs)
    bound.apply_defaults()
    out = dict(bound.arguments)
    out.pop(next(iter(sig.parameters)))  # self
    out.pop("socket", None)  # injected by TransferQueue's decorator, never by callers
    return out
