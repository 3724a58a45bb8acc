"""InMemoryDataPlane: the embedded reference data plane, and a server that shares one
instance between OS processes (the bytes really cross a process boundary, pickled)."""
from __future__ import annotations

import multiprocessing
import threading
import time
from collections import OrderedDict
from multiprocessing.managers import BaseManager
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

Key = tuple[str, ...]  # a field name, nested keys flattened to a path


class InMemoryDataPlane:
    """A thread-safe key-value tensor store keyed by (partition, sample id, field).

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
        ids = _check_ids(sample_ids)
        if fields is not None and fields.batch_size[:1] != torch.Size([len(ids)]):
            raise ValueError(f"fields has batch size {tuple(fields.batch_size)}, "
                             f"expected ({len(ids)},) for {len(ids)} sample ids")
        if tags is not None and len(tags) != len(ids):
            raise ValueError(f"{len(tags)} tags for {len(ids)} sample ids")
        columns = _split_columns(fields) if fields is not None else {}
        with self._lock:
            part = self._rows.setdefault(partition_id, OrderedDict())
            part_tags = self._tags.setdefault(partition_id, {})
            for i, sid in enumerate(ids):
                row = part.setdefault(sid, {})  # an existing row gains or replaces fields
                for key, col in columns.items():
                    row[key] = col[i]
                if tags is not None:
                    part_tags[sid] = dict(tags[i])

    def get_samples(self, sample_ids: list[str], partition_id: str,
                    select_fields: list | None = None) -> TensorDict:
        self._wait()
        ids = _check_ids(sample_ids)
        with self._lock:
            part = self._partition(partition_id)
            rows = []
            for sid in ids:
                row = part.get(sid)
                if row is None:
                    raise KeyError(f"sample id {sid!r} not in partition {partition_id!r}")
                rows.append(row)
            keys = _selected_keys(rows, select_fields)
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
            out.set(key if len(key) > 1 else key[0], _assemble(values))
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
                for sid in _check_ids(sample_ids):
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


def _check_ids(sample_ids) -> list[str]:
    if isinstance(sample_ids, (str, bytes)) or not hasattr(sample_ids, "__iter__"):
        raise TypeError(f"sample_ids must be a list of str, got {type(sample_ids).__name__}")
    ids = list(sample_ids)
    if len(set(ids)) != len(ids):
        raise ValueError("sample_ids contains duplicates")
    return ids


def _split_columns(td: TensorDictBase, prefix: Key = ()) -> dict[Key, list]:
    """Field -> one stored value per row. Rows are views of a private copy (so the caller
    may reuse its buffers), made with one copy per field rather than one per row."""
    n = td.batch_size[0]
    out: dict[Key, list] = {}
    for name, v in td.items():
        key = prefix + (name,)
        if isinstance(v, (NonTensorData, NonTensorStack)):
            values = v.tolist()
            out[key] = values if isinstance(values, list) and len(values) == n else [values] * n
        elif isinstance(v, TensorDictBase):
            out.update(_split_columns(v, key))
        elif v.is_nested:
            if v._lengths is not None:  # a narrowed view: gather each row's own span
                out[key] = [r.clone() for r in v.unbind()]
            else:
                off = v.offsets()
                values = v.values()[int(off[0]):int(off[-1])].clone()
                out[key] = list(torch.split(values, off.diff().tolist()))
        else:
            out[key] = list(v.detach().clone().unbind(0))
    return out


def _selected_keys(rows: list[dict], select_fields) -> list[Key]:
    if select_fields is not None:
        return [f if isinstance(f, tuple) else (f,) for f in select_fields]
    if not rows:
        return []
    common = set(rows[0])
    for row in rows[1:]:
        common &= row.keys()
    return [k for k in rows[0] if k in common]  # first row's order, fields every row has


def _assemble(values: list):
    first = values[0] if values else None
    if not isinstance(first, torch.Tensor):
        return NonTensorStack.from_list(values)
    if all(v.shape == first.shape for v in values):
        return torch.stack(values)
    return torch.nested.as_nested_tensor(values, layout=torch.jagged)


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
