"""`MooncakeDataPlane` keeps the data-plane protocol on Mooncake's keys (`ns` = namespace,
every name part escaped so "/" and "." cannot collide):

    {ns}/{partition}/.slot/{i}       which ids each writer put and cleared (index.py)
    {ns}/{partition}/{sid}           the row's manifest: its fields' kinds, in order, tags,
                                     and row age's write stamp (rowage.py), when it has one
    {ns}/{partition}/{sid}/{field}   one value per row and field: a tensor (put_tensor), or
                                     a pickled non-tensor value (bytes)

A read takes the manifests (one batch) and then only the selected fields' keys (one batch
for tensors, one for other values), so select_fields moves only what it names. A put merges
into existing manifests, so a delta write adds fields to rows another process wrote; the
guard's digest columns are int64 fields like any other and travel with the rows. Row age's
stamp column does not become a key of its own: each row's stamp is one int in the manifest a
read fetches anyway, and a select of the column gets every row's (NOT_STAMPED where a row
has none) instead of refusing the read; a put without one keeps the row's old stamp.

Mooncake has no key listing, and two clients upserting one key at once can lose it, so no
key is written by two processes on purpose: the listing lives in per-writer slots
(index.py), manifests and values are per row. Two processes writing the same row at
the same instant is the one race left (docs/guides/mooncake.md).

Every store call the plane makes (its index's and its deferred removals' too) is marked as
dpobs's own: MooncakeInstrumentor, if active, leaves them to the plane's own measurement.
"""
from __future__ import annotations

import pickle
import time

import msgpack
import torch
from tensordict import TensorDict

from ...rowage import STAMP
from ...stores.rows import (assemble, check_ids, check_put, read_stamps, selected_keys,
                            split_columns, take_stamps)
from ..instrumentation import OwnCalls
from .index import REREAD_S, PartitionIndex
from .leases import DeferredRemovals
from .store import HAS_LEASE, NOT_FOUND, mooncake_error

__all__ = ["MooncakeDataPlane"]

# Kinds of a stored value, as the manifest records them.
TENSOR, SCALAR, OBJECT, RAW = 0, 1, 2, 3  # RAW: [3, dtype, shape], bytes in a uint8 tensor
# What put_tensor keeps with dtype and shape (0.3.13, each checked; complex and the fnuz
# float8s are refused with -600).
NATIVE_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16,
                           torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                           torch.uint16, torch.uint32, torch.uint64, torch.bool,
                           torch.float8_e4m3fn, torch.float8_e5m2})
TOMBSTONE = msgpack.packb(None)  # a cleared row whose manifest is still leased



def _esc(part: str) -> str:
    return part.replace("%", "%25").replace("/", "%2F").replace(".", "%2E")


def _path(key: tuple) -> str:
    return ".".join(_esc(p) for p in key)


def _encode(value):
    """(kind, what to store) of one row's value."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        if t.dtype not in NATIVE_DTYPES:
            return [RAW, str(t.dtype).removeprefix("torch."), list(t.shape)], \
                t.reshape(-1).view(torch.uint8)
        return (SCALAR if t.dim() == 0 else TENSOR), t
    return OBJECT, pickle.dumps(value, protocol=5)


def _decode(kind, stored):
    if kind == TENSOR:
        return stored
    if kind == SCALAR:
        return stored.reshape(())  # Mooncake hands a 0-d tensor back as shape (1,)
    if kind == OBJECT:
        return pickle.loads(stored)
    _, dtype, shape = kind
    return stored.view(getattr(torch, dtype)).reshape(shape)


def _is_tensor_kind(kind) -> bool:
    return kind != OBJECT


class MooncakeDataPlane:
    """The data-plane protocol (DESIGN.md) over a set-up MooncakeDistributedStore.

    `lease_s`: the master's -default_kv_lease_ttl in seconds; a clear that meets a read
    lease removes the rest now and the leased keys `lease_s` later (`pending_clears` counts
    them meanwhile; docs/guides/mooncake.md). `namespace` prefixes every key."""

    def __init__(self, store, *, namespace: str = "dpobs", lease_s: float = 10.0):
        self._store = store
        self._s = OwnCalls(store)  # every call through it is the plane's own
        self._ns = _esc(namespace)
        self._index = PartitionIndex(self._s, self._ns, _check)
        self._claimed: dict[tuple[str, str], set[str]] = {}
        self._deferred = DeferredRemovals(self._s.batch_remove, lease_s)

    def __repr__(self) -> str:
        return f"MooncakeDataPlane(namespace={self._ns!r})"

    @property
    def store(self):
        return self._store

    @property
    def pending_clears(self) -> int:
        """Keys cleared but still in Mooncake, waiting for a read lease to end."""
        return len(self._deferred)

    def flush_clears(self, timeout: float = 30.0) -> bool:
        """Wait for deferred removals; True when none is left."""
        return self._deferred.flush(timeout)

    def close(self) -> None:
        """Stop the removal thread (pending keys stay in the store)."""
        self._deferred.close()

    # -- keys -------------------------------------------------------------------------
    def _row_key(self, pid: str, sid: str) -> str:
        return f"{self._ns}/{_esc(pid)}/{_esc(sid)}"

    # -- the protocol -----------------------------------------------------------------
    def register_partition(self, partition_id: str, **_meta) -> None:
        self._index.register(_esc(partition_id))

    def put_samples(self, sample_ids, partition_id, fields=None, tags=None) -> None:
        ids = check_put(sample_ids, fields, tags)
        fields, stamps = take_stamps(fields)  # into the manifests, not a key per row
        columns = split_columns(fields) if fields is not None else {}
        found, old_tags, old_stamps = self._manifests(partition_id, ids)
        rows = [r or {} for r in found]
        tensor_keys, tensors, object_keys, objects, manifests = [], [], [], [], []
        for i, sid in enumerate(ids):
            row, base = rows[i], self._row_key(partition_id, sid)
            for key, col in columns.items():
                kind, stored = _encode(col[i])
                row[key] = kind
                if kind == OBJECT:
                    object_keys.append(f"{base}/{_path(key)}")
                    objects.append(stored)
                else:
                    tensor_keys.append(f"{base}/{_path(key)}")
                    tensors.append(stored)
            tag = tags[i] if tags is not None else old_tags[i]
            stamp = stamps[i] if stamps is not None else old_stamps[i]
            manifests.append(msgpack.packb([[[list(k), v] for k, v in row.items()], tag,
                                            stamp]))
        row_keys = [self._row_key(partition_id, sid) for sid in ids]
        self._deferred.cancel(tensor_keys + object_keys + row_keys)
        if tensor_keys:
            _check(self._s.batch_upsert_tensor(tensor_keys, tensors), tensor_keys)
        if object_keys:
            _check(self._s.upsert_batch(object_keys, objects), object_keys)
        _check(self._s.upsert_batch(row_keys, manifests), row_keys)
        self._index.add(_esc(partition_id), {sid: [list(p) for p in row]
                                             for sid, row in zip(ids, rows)})

    def get_samples(self, sample_ids, partition_id, select_fields=None) -> TensorDict:
        ids = check_ids(sample_ids)
        rows, _, stamps = self._manifests(partition_id, ids)
        absent = [i for i, row in enumerate(rows) if row is None]
        if absent:  # a key being upserted reads as absent for a moment: look once more
            time.sleep(REREAD_S)
            again = self._manifests(partition_id, [ids[i] for i in absent])
            for i, row, stamp in zip(absent, again[0], again[2]):
                rows[i], stamps[i] = row, stamp
        for sid, row in zip(ids, rows):
            if row is None:
                raise KeyError(f"sample id {sid!r} not in partition {partition_id!r}")
        select_fields, stamped = read_stamps(select_fields, lambda: stamps)
        keys = selected_keys(rows, select_fields)
        plan = []  # (field, kind per row, store keys)
        for key in keys:
            kinds = []
            for sid, row in zip(ids, rows):
                kind = row.get(key)
                if kind is None:
                    raise KeyError(f"field {'.'.join(key)!r} not written for sample id "
                                   f"{sid!r} in partition {partition_id!r}")
                kinds.append(kind)
            plan.append((key, kinds, [f"{self._row_key(partition_id, sid)}/{_path(key)}"
                                      for sid in ids]))
        values = self._fetch(plan)
        out = TensorDict({}, batch_size=[len(ids)])
        for key, kinds, store_keys in plan:
            column = []
            for kind, skey in zip(kinds, store_keys):
                stored = values[skey]
                if stored is None:  # cleared between the manifest read and this one
                    raise KeyError(f"{skey!r} vanished during the read "
                                   f"(partition {partition_id!r})")
                column.append(_decode(kind, stored))
            out.set(key if len(key) > 1 else key[0], assemble(column))
        if stamped is not None:
            out.set(STAMP, stamped)
        return out

    get_data = get_samples  # TransferQueue-style name for the same read

    def clear_samples(self, sample_ids, partition_id) -> None:
        ids = None if sample_ids is None else check_ids(sample_ids)
        removed = self._index.drop(_esc(partition_id), ids)
        row_keys = [self._row_key(partition_id, sid) for sid in removed]
        keys = list(row_keys)
        for base, paths in zip(row_keys, removed.values()):
            keys.extend(f"{base}/{_path(tuple(p))}" for p in paths)
        if not keys:
            return
        codes = self._s.batch_remove(keys)
        leased = [k for k, c in zip(keys, codes) if c == HAS_LEASE]
        if leased:
            # A leased manifest still answers reads: mark the row cleared until it goes.
            manifests = [k for k, c in zip(row_keys, codes) if c == HAS_LEASE]
            if manifests:
                _check(self._s.upsert_batch(manifests, [TOMBSTONE] * len(manifests)),
                       manifests)
            self._deferred.add(leased)
        failed = [(k, c) for k, c in zip(keys, codes) if c not in (0, NOT_FOUND, HAS_LEASE)]
        if failed:
            raise mooncake_error(failed[0][1], f"remove of {failed[0][0]!r} "
                                               f"({len(failed)} keys failed)")

    def list_sample_ids(self, partition_id) -> list[str]:
        return list(self._index.live(_esc(partition_id)))

    def claim_meta(self, partition_id, count, consumer="default") -> list[str]:
        """Up to `count` ids this consumer has not claimed yet, oldest first. The claims are
        this process's: Mooncake keeps no consumer state."""
        live = self.list_sample_ids(partition_id)
        claimed = self._claimed.setdefault((partition_id, consumer), set())
        claimed.intersection_update(live)
        ids = [sid for sid in live if sid not in claimed][:count]
        claimed.update(ids)
        return ids

    def get_tags(self, sample_ids, partition_id) -> list:
        rows, tags, _ = self._manifests(partition_id, list(sample_ids))
        return [t if r is not None else None for r, t in zip(rows, tags)]

    # -- manifests and the index --------------------------------------------------------
    def _manifests(self, pid, ids):
        """([{field path: kind} or None per id], [tags per id], [stamp or None per id]);
        None: absent or cleared (or, for a stamp, written without row age)."""
        if not ids:
            return [], [], []  # get_batch([]) answers [b''], not []
        raw = self._s.get_batch([self._row_key(pid, sid) for sid in ids])
        rows, tags, stamps = [], [], []
        for blob in raw:
            m = msgpack.unpackb(blob, use_list=True) if blob else None
            if m is None:
                rows.append(None)
                tags.append(None)
                stamps.append(None)
                continue
            rows.append({tuple(p): kind for p, kind in m[0]})
            tags.append(m[1])
            stamps.append(m[2] if len(m) > 2 else None)  # manifests of older writers: two
        return rows, tags, stamps

    def _fetch(self, plan) -> dict:
        tensor_keys = [k for _, kinds, keys in plan for kind, k in zip(kinds, keys)
                       if _is_tensor_kind(kind)]
        object_keys = [k for _, kinds, keys in plan for kind, k in zip(kinds, keys)
                       if not _is_tensor_kind(kind)]
        values = self._get_values(tensor_keys, object_keys)
        gone = [k for k, v in values.items() if v is None]
        if gone:  # rewritten by another client just now (see get_samples): once more
            time.sleep(REREAD_S)
            tensor = set(tensor_keys)
            values.update(self._get_values([k for k in gone if k in tensor],
                                           [k for k in gone if k not in tensor]))
        return values

    def _get_values(self, tensor_keys, object_keys) -> dict:
        values = {}
        if tensor_keys:
            values.update(zip(tensor_keys, self._s.batch_get_tensor(tensor_keys)))
        if object_keys:
            values.update((k, v or None) for k, v in
                          zip(object_keys, self._s.get_batch(object_keys)))
        return values


def _check(codes, keys) -> None:
    """Raise MooncakeError on the first negative code (an int or a list of them)."""
    if isinstance(codes, int):
        if codes < 0:
            raise mooncake_error(codes, f"{len(keys)} keys, first {keys[0]!r}")
        return
    for key, code in zip(keys, codes):
        if code < 0:
            raise mooncake_error(code, f"key {key!r}")
