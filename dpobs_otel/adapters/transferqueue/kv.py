"""TransferQueue's key-value API measured as the ops of the contract.

`TransferQueueDataPlane` is the data-plane protocol over the `transfer_queue` module;
`InstrumentedTransferQueue` (what `instrument` returns) keeps TransferQueue's own names and
routes every kv_* call through `tel.instrument(TransferQueueDataPlane())`, so timing, bytes,
keys, missing rows, occupancy and the wire guard all live in the core's one wrapper. init
and close also turn TransferQueue's own exporter on when asked and announce it
(store_metrics.py); anything else (get_client, ...) passes through to the module.

What TransferQueue does that the adapter has to handle (docs/guides/transferqueue.md):
  * kv_batch_get drops absent keys silently when others are present, and returns an EMPTY
    TensorDict when a selected field is missing on some key. The second becomes a KeyError;
    for the first, the core sees a short read, counts the rows missing, and asks
    `returned_sample_ids` which ids the rows belong to (one kv_list), which also logs the
    missing ids.
  * kv_batch_get returns no tags; kv_list does. The guard's digests travel in the rows' tags
    (digests.py), so a guarded read looks the rows up itself with the two client calls
    kv_batch_get is made of, and gets the tags with them; a guarded put likewise makes
    kv_batch_put's three calls itself, to merge its digests with the rows' current tags.

The data plane's calls into TransferQueue are marked as dpobs's own (instrumentation.own, on
the thread that makes them), so TransferQueueInstrumentor's patched entry points, if active,
do not measure them a second time.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ...guard import is_digest_field
from ..instrumentation import MEASURED, own
from .digests import (carries_tags, digest_columns, parser_kwargs, put_with_digests,
                      strip_digest_tags, without_digest_tags)
from .store_metrics import StoreMetrics

__all__ = ["TransferQueueDataPlane", "InstrumentedTransferQueue", "instrument"]

log = logging.getLogger("dpobs_otel.adapters.transferqueue")  # the name users filter on

# A short-read log line names at most this many missing ids (the counter has them all).
MAX_LOGGED_IDS = 16
# At most one short-read line per partition per interval; the next line sums the ones held back.
LOG_INTERVAL_S = 60.0
# Partitions remembered for that; past this many, those quiet for an interval are forgotten.
MAX_LOG_PARTITIONS = 4096
_clock = time.monotonic  # module attribute: tests move time forward
# Worker threads for the async_kv_* variants (see InstrumentedTransferQueue._run_async).
ASYNC_WORKERS = 16


def _tq_module():
    import transfer_queue  # the optional extra: pip install dpobs-otel[transferqueue]

    return transfer_queue


class _Unmeasured:
    """A transfer_queue module as the adapter calls it: where TransferQueueInstrumentor has
    replaced a kv_* function, TransferQueue's own one, so that code using this adapter
    under the instrumentor (opentelemetry-instrument) is measured once per call, not twice."""

    def __init__(self, module):
        self.__dict__["_module"] = module

    def __getattr__(self, name):
        value = getattr(self.__dict__["_module"], name)
        return value.__wrapped__ if getattr(value, MEASURED, False) else value


def _as_list(x):
    return [x] if isinstance(x, str) else x


class _Listing(dict):
    """A kv_list answer as the core should count it: one entry per key (over all partitions:
    {(partition, key): tags}); `.nested` is TransferQueue's own answer, handed back as is."""

    __slots__ = ("nested",)

    @classmethod
    def of(cls, nested: dict, flat) -> "_Listing":
        out = cls(flat)
        out.nested = nested
        return out


class TransferQueueDataPlane:
    """The data-plane protocol (DESIGN.md) over the `transfer_queue` module's kv_* API.

    digests: the wire guard or row age is on (`instrument` sets it from the Telemetry): a full
    read then hands back the rows' digests and stamps for them. Reads that name digest columns get them
    either way."""

    def __init__(self, module=None, digests: bool = False):
        self._tq = _Unmeasured(module if module is not None else _tq_module())
        self._digests = digests
        self._short_reads = _ShortReadLog()

    def __repr__(self) -> str:
        return f"TransferQueueDataPlane({getattr(self._tq, '__name__', self._tq)!r})"

    # protocol.OverlapsGuard: with the guard on, the rows are fingerprinted while the lookup
    # that starts every put (kv_retrieve_meta, a round trip) runs.
    overlaps_guard = True

    # `refused`: an argument check the adapter makes where TransferQueue makes it, before any
    # I/O (InstrumentedTransferQueue); raised here, inside the measured call, so the refused
    # call is timed and counted as an error like every other failed op.
    @own
    def put_samples(self, sample_ids, partition_id, fields=None, tags=None, data_parser=None,
                    refused=None, pending_fields=None):
        if refused is not None:
            raise refused
        if pending_fields is not None or (
                fields is not None and any(is_digest_field(k) for k in fields.keys())):
            return put_with_digests(self._tq.get_client(), sample_ids, partition_id, fields,
                                    tags, data_parser, pending_fields)
        return self._tq.kv_batch_put(keys=sample_ids, partition_id=partition_id, fields=fields,
                                     tags=tags, **parser_kwargs(data_parser))

    @own
    def get_samples(self, sample_ids, partition_id, select_fields=None, refused=None):
        if refused is not None:
            raise refused
        if (self._digests and select_fields is None) or (
                select_fields is not None and any(is_digest_field(f) for f in select_fields)):
            return self._get_with_digests(sample_ids, partition_id, select_fields)
        out = self._tq.kv_batch_get(keys=sample_ids, partition_id=partition_id,
                                    select_fields=select_fields)
        # All keys absent raises ValueError in TransferQueue itself. An empty result for a
        # non-empty request therefore means a selected field is missing on some key.
        if sample_ids and out.batch_size[0] == 0:
            raise KeyError(_missing_field(select_fields, sample_ids, partition_id))
        if select_fields is not None:
            absent = [f for f in select_fields if f not in out.keys()]
            if absent:
                raise KeyError(f"fields {absent!r} missing from the read of partition "
                               f"{partition_id!r}")
        return out

    def _get_with_digests(self, sample_ids, partition_id, select_fields):
        """kv_batch_get's own steps (look the rows up, select, check, fetch), through the
        client's public calls, keeping the rows' tags: the digests are among them."""
        client = self._tq.get_client()
        meta = client.kv_retrieve_meta(keys=sample_ids, partition_id=partition_id, create=False)
        if meta.size == 0:
            raise ValueError("keys or partition were not found!")  # TransferQueue's words
        if select_fields is not None:
            select = [f for f in select_fields if not is_digest_field(f)]
            if any(f not in meta.field_names for f in select):
                raise KeyError(_missing_field(select, sample_ids, partition_id))
            meta = meta.select_fields(select)
        if not meta.is_ready:
            raise ValueError("Some fields are not ready in all the requested keys!")
        return digest_columns(client.get_data(meta), meta.custom_meta)

    def register_partition(self, partition_id, **_meta) -> None:
        """The protocol's register: TransferQueue makes a partition on its first put, so
        there is nothing to do (the op is still measured, as a call that did nothing)."""

    @own
    def clear_samples(self, sample_ids, partition_id, as_given=False):
        """as_given (kv_clear): keys go to TransferQueue unchanged, so keys=None is refused
        there (TypeError) as on the bare module, never read as "the whole partition"."""
        if sample_ids is None and not as_given:  # the protocol's "everything in the partition"
            sample_ids = list(self._keys(partition_id))
            if not sample_ids:
                return None
        return self._tq.kv_clear(keys=sample_ids, partition_id=partition_id)

    @own
    def list_sample_ids(self, partition_id, with_tags=False):
        """The protocol's list of ids; with_tags=True (InstrumentedTransferQueue.kv_list):
        a _Listing, partition_id=None meaning every partition, as in kv_list."""
        nested = self._tq.kv_list(partition_id)
        if not with_tags:
            return list(nested.get(partition_id, ()))
        nested = {pid: {k: without_digest_tags(t) for k, t in keys.items()}
                  for pid, keys in nested.items()}
        if partition_id is not None:
            return _Listing.of(nested, nested.get(partition_id, {}))
        return _Listing.of(nested, (((pid, k), tags) for pid, keys in nested.items()
                                    for k, tags in keys.items()))

    @own
    def returned_sample_ids(self, sample_ids, partition_id, result):
        """The core's hook for a short read: the ids of the rows that came back, in order.

        TransferQueue keeps the requested order and drops absent keys, so the present ids are
        the requested ones that kv_list still knows. Logs the missing ones (_ShortReadLog;
        the core counts every one of them in rows.missing). Returns None when the listing
        does not account for the rows (a key put or cleared in between): the core then hands
        the guard the requested ids and it counts the rows unverified."""
        live = self._keys(partition_id)
        present = [k for k in sample_ids if k in live]
        n = result.batch_size[0]
        self._short_reads.report(partition_id, sample_ids, n,
                                 [k for k in sample_ids if k not in live])
        return present if len(present) == n else None

    def _keys(self, partition_id) -> dict:
        return self._tq.kv_list(partition_id).get(partition_id, {})


class _ShortReadLog:
    """Short-read warnings, at most one per partition per LOG_INTERVAL_S: a trainer that
    keeps asking for dropped rows must not flood its log. The line that ends a quiet
    interval says how many reads and rows were held back; rows.missing has them all."""

    def __init__(self):
        self._lock = threading.Lock()  # the async API reads on several threads
        self._held: dict = {}  # partition -> [time of its last line, reads held, rows held]

    def report(self, partition_id, sample_ids, returned: int, missing: list) -> None:
        now = _clock()
        rows = len(sample_ids) - returned
        with self._lock:
            held = self._held.get(partition_id)
            if held is not None and now - held[0] < LOG_INTERVAL_S:
                held[1] += 1
                held[2] += rows
                return
            if held is None and len(self._held) >= MAX_LOG_PARTITIONS:
                self._held = {p: h for p, h in self._held.items()
                              if now - h[0] < LOG_INTERVAL_S}
            self._held[partition_id] = [now, 0, 0]
        shown = ", ".join(map(str, missing[:MAX_LOGGED_IDS]))
        more = f" (+{len(missing) - MAX_LOGGED_IDS} more)" if len(missing) > MAX_LOGGED_IDS else ""
        since = ""
        if held is not None and held[1]:
            since = (f"; {held[1]} earlier short reads ({held[2]} rows) not logged "
                     f"(one line per partition per {LOG_INTERVAL_S:.0f} s)")
        log.warning("dpobs transferqueue: read of %d keys from partition %r returned %d rows; "
                    "missing: %s%s%s", len(sample_ids), partition_id, returned, shown, more,
                    since)


class InstrumentedTransferQueue(StoreMetrics):
    """TransferQueue's module API with the kv_* functions measured by dpobs.

    Differences from the bare module, all deliberate:
      * kv_batch_get / kv_batch_get_by_meta raise KeyError where TransferQueue would return an
        empty TensorDict (a selected field missing on some key): silence there loses rows.
      * KVBatchMeta.fields from a put leaves out the guard's digest columns.
    """

    def __init__(self, tel, module=None):
        self._tel = tel
        self._tq = _Unmeasured(module if module is not None else _tq_module())
        self.data_plane = TransferQueueDataPlane(self._tq, digests=carries_tags(tel))
        self.client = tel.instrument(self.data_plane)
        self._pool = None
        self._pool_lock = threading.Lock()

    def __getattr__(self, name):  # init, close, get_client, KVBatchMeta, ...: untouched
        tq = self.__dict__.get("_tq")  # not self._tq: no recursion before __init__ has run
        if tq is None:
            raise AttributeError(name)
        return getattr(tq, name)

    def __repr__(self) -> str:
        return f"InstrumentedTransferQueue({self._tq!r})"

    # -- sync -------------------------------------------------------------------------
    def kv_batch_put(self, keys, partition_id, fields=None, tags=None, data_parser=None):
        meta = self.client.put_samples(keys, partition_id, fields, tags, data_parser=data_parser)
        return _clean_meta(meta)

    def kv_put(self, key, partition_id, fields=None, tag=None, data_parser=None):
        tags = None if tag is None else [tag]
        try:
            if fields is None and tag is None:
                raise ValueError("Please provide at least one parameter of fields or tag.")
            if fields is not None:
                fields = _one_row(fields)
        except ValueError as exc:  # TransferQueue's own refusals, with its words
            return self.client.put_samples([key], partition_id, None, tags, refused=exc)
        return self.kv_batch_put([key], partition_id, fields, tags, data_parser)

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        select = None if select_fields is None else _as_list(select_fields)
        return self.client.get_samples(_as_list(keys), partition_id, select)

    def kv_batch_get_by_meta(self, meta, select_fields=None):
        try:
            select = _meta_select(meta, select_fields)
        except ValueError as exc:
            return self.client.get_samples(list(meta.keys), meta.partition_id, None,
                                           refused=exc)
        return self.kv_batch_get(meta.keys, meta.partition_id, select)

    def kv_list(self, partition_id=None):
        return self.client.list_sample_ids(partition_id, with_tags=True).nested

    def kv_clear(self, keys, partition_id):
        self.client.clear_samples(_as_list(keys), partition_id, as_given=True)

    # -- async ------------------------------------------------------------------------
    # The core's wrapper is synchronous. Rather than keep a second copy of its bookkeeping
    # (guard hooks, digest retry, bytes, missing rows), the awaited call runs the same
    # measured sync path on a worker thread; that path submits TransferQueue's own coroutine
    # to its client loop and waits, exactly what the sync API does, so the duration recorded
    # is the awaited TransferQueue call. The caller's event loop never blocks.
    async def async_kv_batch_put(self, keys, partition_id, fields=None, tags=None,
                                 data_parser=None):
        return await self._run_async(self.kv_batch_put, keys, partition_id, fields, tags,
                                     data_parser)

    async def async_kv_put(self, key, partition_id, fields=None, tag=None, data_parser=None):
        return await self._run_async(self.kv_put, key, partition_id, fields, tag, data_parser)

    async def async_kv_batch_get(self, keys, partition_id, select_fields=None):
        return await self._run_async(self.kv_batch_get, keys, partition_id, select_fields)

    async def async_kv_batch_get_by_meta(self, meta, select_fields=None):
        return await self._run_async(self.kv_batch_get_by_meta, meta, select_fields)

    async def async_kv_list(self, partition_id=None):
        return await self._run_async(self.kv_list, partition_id)

    async def async_kv_clear(self, keys, partition_id):
        return await self._run_async(self.kv_clear, keys, partition_id)

    async def _run_async(self, fn, *args):
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(ASYNC_WORKERS,
                                                    thread_name_prefix="dpobs-tq-async")
        loop = asyncio.get_running_loop()
        pending = loop.run_in_executor(self._pool, functools.partial(fn, *args))
        awaiting = getattr(self.client, "awaiting", None)  # None when dpobs is off
        # Exposure belongs to this coroutine's task, not to the worker thread.
        return await (pending if awaiting is None else awaiting(pending))


def _missing_field(select_fields, sample_ids, partition_id) -> str:
    return (f"select_fields {select_fields!r}: some field is missing on some of the "
            f"{len(sample_ids)} keys in partition {partition_id!r} (TransferQueue returns an "
            "empty TensorDict)")


def _meta_select(meta, select_fields):
    """The fields a kv_batch_get_by_meta reads, refused as TransferQueue refuses them."""
    if meta.partition_id is None:
        raise ValueError("Must provide partition_id in the input KVBatchMeta.")
    if select_fields is None:
        return meta.fields
    select = _as_list(select_fields)
    if meta.fields is None or any(f not in meta.fields for f in select):
        raise ValueError(f"Some fields assigned in select_fields not found in the metadata. "
                         f"Assigned: {select}; Fields in KVBatchMeta: {meta.fields}.")
    return select


def _one_row(fields):
    """kv_put's fields as a one-row TensorDict, the way TransferQueue builds it from a dict
    (tensors unsqueezed, other values as a NonTensorStack), so the guard and byte count see
    exactly what is stored."""
    from tensordict import NonTensorStack, TensorDict
    import torch

    if isinstance(fields, dict):
        batch = {}
        for name, value in fields.items():
            if isinstance(value, torch.Tensor):
                if value.is_nested:
                    raise ValueError("Please use (async)kv_batch_put for batch operation")
                batch[name] = value.unsqueeze(0)
            else:
                batch[name] = NonTensorStack(value)
        return TensorDict(batch, batch_size=[1])
    if not isinstance(fields, TensorDict):
        raise ValueError("`fields` can only be dict or TensorDict")
    return fields


def _clean_meta(meta):
    """A put's KVBatchMeta as the caller's data has it: no digest fields or tags. Its tag
    dicts are TransferQueue's copies for this call alone, so they lose the entries in place."""
    fields = getattr(meta, "fields", None)
    if fields:
        meta.fields = [f for f in fields if not is_digest_field(f)]
    tags = getattr(meta, "tags", None)
    if tags:
        meta.tags = strip_digest_tags(tags, in_place=True)
    return meta


def instrument(tel, module=None):
    """`transfer_queue` with its kv_* API measured by `tel` (one dpobs Telemetry): an
    InstrumentedTransferQueue; with dpobs switched off, the module itself."""
    if not tel.enabled:
        return module if module is not None else _tq_module()
    return InstrumentedTransferQueue(tel, module)
