"""What one client has put and not cleared: the live keys and their bytes, per partition.

A put to a key that is already live replaces that key's row, as every store does, and a
delta write that adds fields to live keys adds just those fields. So bytes are kept per
field: each field has a live-key set and a byte total. There is no per-key truth to keep
(a put's bytes spread evenly over its keys), so replacing or clearing some of a field's
keys releases that field's bytes pro rata; this is exact whenever the rows replaced or
cleared are the same size, and clearing a field's last key releases its remainder exactly,
so a partition returns to zero however it is chopped up.

Fields written together share one key set (a `_Group`), so the common put (fresh ids, the
same fields as before) costs one set update, not one per field. A put that names only some
of a group's fields splits the group first.

Only this process's own puts are counted: rows other processes write to the same ids are
outside it. All methods run under the caller's lock (Stats.lock).
"""
from __future__ import annotations

# Occupancy's names for a put's tags (stored per row like a field) and for the rows of a
# put with no sized field: no fields at all, or sizing failed (the keys are live; bytes 0).
TAGS = "\x00tags"
UNSIZED = "\x00unsized"


class _Group:
    """Keys and per-field bytes of fields written together. A fresh group keeps the ids of
    its one put as a list and builds the set only when something needs it (a second put, a
    partial clear, a listing): the common cycle, put then clear of the same ids, never does."""

    __slots__ = ("_keys", "_put", "bytes")

    def __init__(self, ids, nbytes: dict[str, float]):
        self._keys: set | None = None
        self._put: list | None = list(ids)  # a copy: the caller may reuse its list
        self.bytes = nbytes  # field -> bytes; the group's fields are this dict's keys

    @property
    def keys(self) -> set:
        if self._keys is None:
            self._keys, self._put = set(self._put), None
        return self._keys

    def replace(self, ids, nbytes: dict[str, int]) -> None:
        """Put `ids` for every field of the group: the overlap's share of each field is
        released, the new bytes added. The overlap comes from the set's growth: one pass."""
        keys = self.keys
        before = len(keys)
        keys.update(ids)
        replaced = len(ids) - (len(keys) - before)
        keep = 1.0 - replaced / before if before else 0.0
        b = self.bytes
        for f in b:
            b[f] = b[f] * keep + nbytes.get(f, 0)

    def release(self, ids) -> None:
        if self._put is not None and ids == self._put:  # exactly the rows put: all of them
            self._keys, self._put = set(), None
            keep = 0.0
        else:
            keys = self.keys
            before = len(keys)
            keys.difference_update(ids)
            if len(keys) == before:
                return
            keep = len(keys) / before
        for f in self.bytes:
            self.bytes[f] *= keep


class _Partition:
    __slots__ = ("groups", "by_field")

    def __init__(self, first: _Group):
        self.groups: list[_Group] = [first]
        self.by_field: dict[str, _Group] = dict.fromkeys(first.bytes, first)

    def put(self, ids, nbytes: dict[str, int]) -> None:
        groups = self.groups
        if len(groups) == 1 and groups[0].bytes.keys() == nbytes.keys():
            groups[0].replace(ids, nbytes)  # the common put: the same fields as before
            return
        by_field = self.by_field
        new = [f for f in nbytes if f not in by_field]
        touched = {id(g): g for f, g in by_field.items() if f in nbytes}
        for g in touched.values():
            if any(f not in nbytes for f in g.bytes):  # only some of its fields: split
                g = self._split(g, [f for f in g.bytes if f in nbytes])
            g.replace(ids, nbytes)
        if new:
            g = _Group(ids, {f: nbytes[f] for f in new})
            self.groups.append(g)
            for f in new:
                by_field[f] = g

    def _split(self, g: _Group, fields: list[str]) -> _Group:
        part = _Group(g.keys, {f: g.bytes.pop(f) for f in fields})
        self.groups.append(part)
        for f in fields:
            self.by_field[f] = part
        return part

    def release(self, ids) -> None:
        emptied = 0
        for g in self.groups:
            g.release(ids)
            emptied += not g.keys
        if emptied == len(self.groups):
            self.groups = []  # the caller drops the partition
        elif emptied:
            self.groups = [g for g in self.groups if g.keys]
            self.by_field = {f: g for g in self.groups for f in g.bytes}

    def live(self) -> set:
        if len(self.groups) == 1:
            return self.groups[0].keys
        return set().union(*(g.keys for g in self.groups))

    def totals(self) -> tuple[float, int]:
        return (sum(sum(g.bytes.values()) for g in self.groups), len(self.live()))


class Occupancy:
    """One client's outstanding rows. `recent`, while a reconciliation lists the store, holds
    the ids put meanwhile, which that reconciliation must not release."""

    __slots__ = ("parts", "recent")

    def __init__(self):
        self.parts: dict[str, _Partition] = {}
        self.recent: dict[str, set] | None = None

    def add(self, partition: str, ids, nbytes: dict[str, int]) -> None:
        p = self.parts.get(partition)
        if p is None:  # a fresh partition: one group of every field, no overlap to judge
            self.parts[partition] = _Partition(_Group(ids, dict(nbytes)))
        else:
            p.put(ids, nbytes)
        if self.recent is not None:
            self.recent.setdefault(partition, set()).update(ids)

    def release(self, partition: str, ids) -> None:
        """Forget `ids` of a partition (None: all of it)."""
        p = self.parts.get(partition)
        if p is None:
            return
        if ids is not None:
            p.release(ids)
        if ids is None or not p.groups:
            del self.parts[partition]

    def live(self, partition: str) -> set:
        p = self.parts.get(partition)
        return p.live() if p is not None else set()

    def totals(self) -> tuple[float, int]:
        size = keys = 0
        for p in self.parts.values():
            b, k = p.totals()
            size += b
            keys += k
        return size, keys
