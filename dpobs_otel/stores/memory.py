"""InMemoryDataPlane: the embedded reference data plane, and a server that shares one
instance between OS processes (the bytes really cross a process boundary, pickled)."""
from __future__ import annotations

import multiprocessing
import threading
import time
from collections import OrderedDict
from multiprocessing.managers import BaseManager
from typing import Any

from tensordict import TensorDict, TensorDictBase

from .rows import (STAMP_KEY, Key, assemble, check_ids, check_put, read_stamps, selected_keys,
                   split_columns, take_stamps)


class InMemoryDataPlane:
    """A thread-safe key-value tensor store keyed by (partition, sample id, field).

    Row age's stamp (rowage.py) is kept per row as an int beside the fields: a read that asks
    for it gets every row's, NOT_STAMPED where a row has none, rather than a refusal, and a
    full read gets it when any row has one (rows.read_stamps).

    Rows keep their own shape: uniform rows of a field come back dense, uneven ones as a
    jagged nested tensor. `latency_s` adds a fixed service time to every call (for demos)."""

    def __init__(self, latency_s: float = 0.0):
        self._rows: dict[str, OrderedDict[str, dict[Key, Any]]] = {}
        self._tags: dict[str, dict[str, dict]] = {}
        self._claimed: dict[tuple[str, str], set[str]] = {}
        self._lock = threading.RLock()
        self.latency_s = float(latency_s)

    # -- the protocol -----------------------------------------------------------------
    def register_partition(self, partition_id: str, **_meta: Any) -> None:
        self._wait()
        with self._lock:
            self._rows.setdefault(partition_id, OrderedDict())
            self._tags.setdefault(partition_id, {})

    def put_samples(self, sample_ids: list[str], partition_id: str,
                    fields: TensorDictBase | None = None, tags: list[dict] | None = None) -> None:
        self._wait()
        ids = check_put(sample_ids, fields, tags)
        fields, stamps = take_stamps(fields)
        columns = split_columns(fields) if fields is not None else {}
        with self._lock:
            part = self._rows.setdefault(partition_id, OrderedDict())
            part_tags = self._tags.setdefault(partition_id, {})
            for i, sid in enumerate(ids):
                row = part.setdefault(sid, {})  # an existing row gains or replaces fields
                for key, col in columns.items():
                    row[key] = col[i]
                if stamps is not None:
                    row[STAMP_KEY] = stamps[i]
                if tags is not None:
                    part_tags[sid] = dict(tags[i])

    def get_samples(self, sample_ids: list[str], partition_id: str,
                    select_fields: list | None = None) -> TensorDict:
        self._wait()
        ids = check_ids(sample_ids)
        with self._lock:
            part = self._partition(partition_id)
            rows = []
            for sid in ids:
                row = part.get(sid)
                if row is None:
                    raise KeyError(f"sample id {sid!r} not in partition {partition_id!r}")
                rows.append(row)
            select, stamps = read_stamps(select_fields,
                                        lambda: [r.get(STAMP_KEY) for r in rows])
            keys = selected_keys(rows, select)
            columns = {}
            for key in keys:
                try:
                    columns[key] = [row[key] for row in rows]
                except KeyError:
                    missing = next(s for s, r in zip(ids, rows) if key not in r)
                    raise KeyError(f"field {'.'.join(key)!r} not written for sample id "
                                   f"{missing!r} in partition {partition_id!r}") from None
        out = TensorDict({}, batch_size=[len(ids)])
        for key, values in columns.items():
            out.set(key if len(key) > 1 else key[0], assemble(values))
        if stamps is not None:
            from ..rowage import STAMP
            out.set(STAMP, stamps)
        return out

    get_data = get_samples  # TransferQueue-style name for the same read

    def clear_samples(self, sample_ids: list[str] | None, partition_id: str) -> None:
        self._wait()
        with self._lock:
            part = self._partition(partition_id)
            tags = self._tags.get(partition_id, {})
            if sample_ids is None:  # the whole partition; it stays registered, empty
                part.clear()
                tags.clear()
            else:
                for sid in check_ids(sample_ids):
                    if part.pop(sid, None) is None:
                        raise KeyError(f"sample id {sid!r} not in partition {partition_id!r}")
                    tags.pop(sid, None)
            for (pid, _), claimed in self._claimed.items():
                if pid == partition_id:
                    claimed.intersection_update(part.keys())

    def list_sample_ids(self, partition_id: str) -> list[str]:
        self._wait()
        with self._lock:
            return list(self._partition(partition_id).keys())

    def claim_meta(self, partition_id: str, count: int, consumer: str = "default") -> list[str]:
        """Up to `count` ids this consumer has not claimed yet, oldest first."""
        self._wait()
        with self._lock:
            part = self._partition(partition_id)
            claimed = self._claimed.setdefault((partition_id, consumer), set())
            ids = [sid for sid in part if sid not in claimed][:count]
            claimed.update(ids)
            return ids

    def get_tags(self, sample_ids: list[str], partition_id: str) -> list[dict | None]:
        with self._lock:
            tags = self._tags.get(partition_id, {})
            return [tags.get(sid) for sid in sample_ids]

    # -- internals --------------------------------------------------------------------
    def _partition(self, partition_id: str):
        part = self._rows.get(partition_id)
        if part is None:
            raise KeyError(f"partition {partition_id!r} does not exist")
        return part

    def _wait(self) -> None:
        if self.latency_s > 0:
            time.sleep(self.latency_s)


# -- sharing one store between processes ---------------------------------------------
class _StoreManager(BaseManager):
    pass


_PROTOCOL = ("put_samples", "get_samples", "get_data", "clear_samples", "list_sample_ids",
             "register_partition", "claim_meta", "get_tags")
_SERVED: dict[str, InMemoryDataPlane] = {}


def _served_store(latency_s: float = 0.0) -> InMemoryDataPlane:
    # Runs in the server process: one store however many clients connect.
    if "store" not in _SERVED:
        _SERVED["store"] = InMemoryDataPlane(latency_s)
    return _SERVED["store"]


_StoreManager.register("store", callable=_served_store, exposed=_PROTOCOL)


def serve_store(latency_s: float = 0.0, authkey: bytes = b"dpobs",
                address: tuple[str, int] = ("127.0.0.1", 0),
                initializer=None) -> tuple[BaseManager, tuple]:
    """Start an InMemoryDataPlane in its own process. Returns (manager, address); call
    manager.shutdown() to stop it. Clients in any process use connect_store(address).
    `initializer` runs first in the server process (e.g. to die with its parent)."""
    mgr = _StoreManager(address=address, authkey=authkey,
                        ctx=multiprocessing.get_context("spawn"))
    mgr.start(initializer)
    mgr.store(latency_s)  # create it now, with its latency, before any client asks
    return mgr, mgr.address


def connect_store(address: tuple[str, int], authkey: bytes = b"dpobs"):
    """A proxy with the data-plane protocol's methods, talking to serve_store's process."""
    mgr = _StoreManager(address=tuple(address), authkey=authkey)
    mgr.connect()
    return mgr.store()
