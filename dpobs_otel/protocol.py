"""The data-plane protocol: what `tel.instrument(...)` wraps, and what every store and
adapter dpobs ships implements (stores.memory.InMemoryDataPlane,
adapters.transferqueue.TransferQueueDataPlane, adapters.mooncake.MooncakeDataPlane).

Only the four core methods are required; the rest are measured when present and pass
through untouched otherwise. Any other attribute of a wrapped client passes through too.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .names import OPS, READ_OPS  # method name -> op label (a closed set: labels stay bounded)

__all__ = ["DataPlane", "ShortReads", "OverlapsGuard", "OPS", "READ_OPS"]


@runtime_checkable
class DataPlane(Protocol):
    def put_samples(self, sample_ids: list[str], partition_id: str, fields: Any = None,
                    tags: list[dict] | None = None) -> Any:
        """Write rows. A put to a live id replaces the fields it names (a delta write adds
        fields to a live row); `fields` is a TensorDict with batch size len(sample_ids)."""

    def get_samples(self, sample_ids: list[str], partition_id: str,
                    select_fields: list[str] | None = None) -> Any:
        """Read rows as a TensorDict in the order asked (all fields when select_fields is
        None). A missing id or field raises KeyError, unless the store drops missing rows
        silently; then it should implement `returned_sample_ids`."""

    def clear_samples(self, sample_ids: list[str] | None, partition_id: str) -> None:
        """Forget rows (None: the whole partition)."""

    def list_sample_ids(self, partition_id: str) -> list[str]:
        """The live ids of a partition (KeyError when the partition does not exist)."""


@runtime_checkable
class ShortReads(Protocol):
    """Optional hook of a store whose reads drop missing rows without raising: given the ids
    asked for and the short result, which ids the result's rows belong to (so the wire guard
    salts each row with its own id). The core calls it only for short reads, and bills it
    to component=adapter."""

    def returned_sample_ids(self, sample_ids: list[str], partition_id: str,
                            result: Any) -> list[str] | None: ...


@runtime_checkable
class OverlapsGuard(Protocol):
    """Optional: a store whose put begins with I/O that does not need the rows' digests
    (TransferQueue looks the rows up, one round trip, before it writes). With the wire guard
    on, the core then fingerprints the rows on a helper thread while that I/O runs, and
    calls `put_samples(..., pending_fields=future)`: `fields` stays the caller's, and
    `future.result()` (which never raises) is what to store, the guard's copy with digest
    columns, or the caller's fields when the guard failed. The guard's time is billed to
    component=guard as usual; the op's time includes the store's wait for the Future only
    where the fingerprints take longer than the I/O they overlap."""

    overlaps_guard: bool  # True
