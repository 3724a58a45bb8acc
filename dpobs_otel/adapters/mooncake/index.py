"""Which sample ids a partition holds, kept in Mooncake by writers that never share a key.

Mooncake 0.3.13 has no key listing and no compare-and-swap, and two clients upserting one key
at once is destructive: one gets ILLEGAL_CLIENT (-601) and the key can be left absent. So
there is no shared index key. Each data plane (one per process, usually) claims a *slot* of
the partition and is the only writer of it:

    {ns}/{partition}/.slot/{i}        the claim: msgpack {"o": owner}, written once
    {ns}/{partition}/.slot/{i}/{0|1}  the content, the two written in turn: msgpack
                                      {"g": generation, "a": {sid: [stamp, paths]},
                                       "d": {sid: stamp}}

Two content keys because a key being upserted reads as absent for a moment: a reader then
finds the previous generation in the other one (a view one write old), never nothing.
"a" records the ids this owner put (with their field paths, which a clear needs to find the
keys), "d" the ids it cleared, each with a time.time_ns() stamp. An id is live when its
newest put stamp is newer than its newest clear stamp over all slots; a listing reads the
slots (in windows, until a whole window is empty) and orders ids by their put stamp.

A key that exists yet reads as absent is read again, READS times at most: Mooncake answers
nothing for a read whose lease ran out before its transfer ended (LEASE_EXPIRED: a 500 ms
lease on a loaded 2-core machine), and a claim lost so ended a listing with "partition does
not exist".

A slot is claimed with `put` (which never replaces an existing object) and read back: the
owner in it says who won. Dead entries are compacted by their owner: a put entry that a
newer clear elsewhere supersedes, a clear entry once no slot holds an older put of the id.
Stamps order a clear and a re-put of one id by different processes: hosts' clocks must agree
to better than the time between the two.
"""
from __future__ import annotations

import threading
import time
import uuid

import msgpack

WINDOW = 16  # slots read per batch; a listing stops at the first window with none in use
COMPACT_EVERY = 64  # puts between compactions of this owner's slot
READS = 3  # reads of a key that exists but answers nothing, before it counts as absent
REREAD_S = 0.002  # before reading a key that was absent once more


class _Slot:
    __slots__ = ("key", "adds", "dels", "puts", "generation")

    def __init__(self, key: str):
        self.key = key
        self.adds: dict[str, list] = {}  # sid -> [stamp, [paths]]
        self.dels: dict[str, int] = {}  # sid -> stamp
        self.puts = 0
        self.generation = 0


class PartitionIndex:
    """The slots of every partition under one namespace, as seen by one owner."""

    def __init__(self, store, namespace: str, check):
        self._s = store
        self._ns = namespace  # already escaped
        self._check = check  # raises on a negative Mooncake code
        self._owner = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._mine: dict[str, _Slot] = {}

    # -- reading ----------------------------------------------------------------------
    def _slot_key(self, pid: str, i: int) -> str:
        return f"{self._ns}/{pid}/.slot/{i}"

    def _get(self, keys: list[str]) -> list[bytes]:
        """get_batch, each key that answered nothing but exists (is_exist: 1) read again."""
        values = list(self._s.get_batch(keys))
        for _ in range(READS - 1):
            empty = [i for i, b in enumerate(values) if not b]
            if not empty:
                break
            codes = self._s.batch_is_exist([keys[i] for i in empty])
            lost = [i for i, code in zip(empty, codes) if code == 1]
            if not lost:
                break
            time.sleep(REREAD_S)
            for i, b in zip(lost, self._s.get_batch([keys[i] for i in lost])):
                values[i] = b
        return values

    def _scan(self, pid: str) -> list[tuple[int, dict]]:
        """(slot number, {"o", "a", "d"}) of every claimed slot, its newest content."""
        found, base = [], 0
        while True:
            keys = [self._slot_key(pid, base + j) for j in range(WINDOW)]
            claims = [(base + j, k, msgpack.unpackb(b)) for j, (k, b)
                      in enumerate(zip(keys, self._get(keys))) if b]
            if not claims:
                return found
            halves = self._get([f"{k}/{h}" for _, k, _ in claims for h in (0, 1)])
            for n, (i, _, claim) in enumerate(claims):
                versions = [msgpack.unpackb(b, use_list=True) for b in halves[2 * n:2 * n + 2]
                            if b]
                newest = max(versions, key=lambda v: v["g"], default={"a": {}, "d": {}})
                found.append((i, {"o": claim["o"], "a": newest["a"], "d": newest["d"]}))
            base += WINDOW

    def live(self, pid: str) -> dict[str, list]:
        """{sid: field paths} of the live ids, oldest put first. KeyError: no such partition."""
        slots = self._scan(pid)
        if not slots:
            raise KeyError(f"partition {pid!r} does not exist")
        return _live([s for _, s in slots])[0]

    # -- writing (this owner's slot only) ---------------------------------------------------
    def register(self, pid: str) -> None:
        with self._lock:
            self._slot(pid)

    def add(self, pid: str, rows: dict[str, list]) -> None:
        """Record a put of these ids with these field paths (merged into earlier ones)."""
        with self._lock:
            slot = self._slot(pid)
            now = time.time_ns()
            for sid, paths in rows.items():
                old = slot.adds.get(sid)
                if old is not None:
                    paths = old[1] + [p for p in paths if p not in old[1]]
                slot.adds[sid] = [now, paths]
                slot.dels.pop(sid, None)
            slot.puts += 1
            if slot.puts % COMPACT_EVERY == 0:
                self._compact(slot, [s for _, s in self._scan(pid)])
            self._write(slot)

    def drop(self, pid: str, ids: list[str] | None) -> dict[str, list]:
        """Record a clear of `ids` (None: every live id); returns {sid: field paths}.
        KeyError, before anything changes, for an id that is not live."""
        with self._lock:
            shards = [s for _, s in self._scan(pid)]
            if not shards:
                raise KeyError(f"partition {pid!r} does not exist")
            live, _ = _live(shards)
            ids = list(live) if ids is None else ids
            missing = [sid for sid in ids if sid not in live]
            if missing:
                raise KeyError(f"sample id {missing[0]!r} not in partition {pid!r}")
            slot = self._slot(pid)
            now = time.time_ns()
            for sid in ids:
                slot.dels[sid] = now
                slot.adds.pop(sid, None)
            self._compact(slot, shards)
            self._write(slot)
            return {sid: live[sid] for sid in ids}

    def _slot(self, pid: str) -> _Slot:
        slot = self._mine.get(pid)
        if slot is None:
            slot = self._mine[pid] = self._claim(pid)
        return slot

    def _claim(self, pid: str) -> _Slot:
        """The first free slot: `put` it with our owner id and read it back; a slot someone
        else won (or is writing: -601) sends us to the next one."""
        mine = msgpack.packb({"o": self._owner})
        used = {i for i, _ in self._scan(pid)}
        i = 0
        while True:
            while i in used:
                i += 1
            key = self._slot_key(pid, i)
            self._s.put(key, mine)
            blob = self._s.get(key)
            if blob and msgpack.unpackb(blob)["o"] == self._owner:
                return _Slot(key)
            used.add(i)

    def _write(self, slot: _Slot) -> None:
        slot.generation += 1
        key = f"{slot.key}/{slot.generation % 2}"
        blob = msgpack.packb({"g": slot.generation, "a": slot.adds, "d": slot.dels})
        self._check(self._s.upsert(key, blob), [key])

    def _compact(self, slot: _Slot, shards: list[dict]) -> None:
        """Drop what no listing needs: our puts superseded by a newer clear anywhere, and
        our clears that no slot holds an older put for (ours as written now included)."""
        shards = [s for s in shards if s["o"] != self._owner]
        newest_del: dict[str, int] = {}
        oldest_add: dict[str, int] = {}
        for s in shards:
            for sid, stamp in s["d"].items():
                newest_del[sid] = max(stamp, newest_del.get(sid, 0))
            for sid, (stamp, _) in s["a"].items():
                oldest_add[sid] = min(stamp, oldest_add.get(sid, stamp))
        for sid in [sid for sid, (stamp, _) in slot.adds.items()
                    if newest_del.get(sid, -1) > stamp]:
            del slot.adds[sid]
        for sid in [sid for sid, stamp in slot.dels.items()
                    if oldest_add.get(sid, stamp + 1) > stamp]:
            del slot.dels[sid]


def _live(shards: list[dict]) -> tuple[dict[str, list], dict[str, int]]:
    """({live sid: union of field paths}, in put order; {sid: newest clear stamp})."""
    dels: dict[str, int] = {}
    for s in shards:
        for sid, stamp in s["d"].items():
            if stamp > dels.get(sid, 0):
                dels[sid] = stamp
    adds: dict[str, list] = {}  # sid -> [newest stamp, oldest stamp, paths]
    for s in shards:
        for sid, (stamp, paths) in s["a"].items():
            cur = adds.get(sid)
            if cur is None:
                adds[sid] = [stamp, stamp, list(paths)]
                continue
            cur[0], cur[1] = max(cur[0], stamp), min(cur[1], stamp)
            cur[2].extend(p for p in paths if p not in cur[2])
    live = [(v[1], sid, v[2]) for sid, v in adds.items() if v[0] > dels.get(sid, 0)]
    live.sort(key=lambda t: t[0])
    return {sid: paths for _, sid, paths in live}, dels
