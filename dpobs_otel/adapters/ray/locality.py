"""Where a Ray op's objects were, and when its moving-data part began (DESIGN.md, "Moving data
versus waiting (Ray)").

A ray_get's data time runs from the moment the last of its objects existed (the op's start
if all did) to its end: the fetch and the deserialization, never the wait for a producer.
Before Ray's get runs, before() reads the core worker's own location table (no RPC, about
1 us a ref): an object with a size or a node already exists, and where it is says its
locality; one that does not exist yet gets ObjectRef._on_ready, which only notes the time
(and where the object is then) on Ray's thread. after() turns that into the op's data time
and its bytes by locality. Ray's private names are in shims/ray_private.py, and each
missing one costs only what needs it (said once): on a Ray without the location table every
object is `unknown` and a get's data time is its deserialization; on one without _on_ready
(before 2.60) only an object not made yet when the get began is `unknown`, and such a get's
data time is its deserialization (when it came to exist cannot be told).

Locality of one object, from the location table:
    this node holds a copy, or this process pulled it before     local
    ... but Ray spilled it and this process has not got it since   spilled (restored by the op)
    another node holds it                                          remote (from that node)
    no node holds it and it was spilled                            spilled (restored by the op)
    no node holds it but its size is known                         local (in the process's own
                                                                   memory store: small objects)
    the lookup failed, or the entry knows neither node nor size    unknown
A borrowed ref's table entry is what its owner said when the ref arrived and does not change
once this process pulls the object, and a spilled object keeps its node and did_spill after
a restore (Ray 2.60: the table cannot tell memory from disk), so the ids of the objects this
process pulled or restored are kept (PULLED_KEEP of them at most, then forgotten at once): the
second get of one is local. A spilled object still in memory, or one evicted and spilled
again after this process got it, is miscounted by that rule.
"""
from __future__ import annotations

from time import perf_counter

from ... import names
from ...shims import ray_private

LOCAL, REMOTE, SPILLED = names.RAY_LOCAL, names.RAY_REMOTE_LOCALITY, names.RAY_SPILLED
MIXED, UNKNOWN = names.RAY_MIXED, names.RAY_UNKNOWN
PULLED_KEEP = 1 << 16
_UNSET = object()


class Look:
    """One get's view before Ray ran it: its start, each ref's (locality, size, from_node)
    or None while its object did not exist, and the times those came to exist."""
    __slots__ = ("start", "refs", "places", "ready", "cancels", "blind")

    def __init__(self, start, refs, places):
        self.start, self.refs, self.places = start, refs, places
        self.ready: list[float] = []
        self.cancels: list = []
        self.blind = False  # an object was not made yet and this Ray cannot say when it is


class Where:
    def __init__(self, said):
        self._said = said  # said(lacking): Ray lacks what locality needs (called once)
        self._read = _UNSET  # the location lookup, resolved once Ray has connected
        self.node = ""  # this process's NodeID
        self._pulled: set[bytes] = set()
        self._ref_type = ()  # ObjectRef: the lookup is handed nothing else (it crashes)
        self._waits = False  # Ray tells when an object not made yet comes to exist

    def _reader(self):
        read = self._read
        if read is _UNSET:
            if not ray_private.connected():  # its core worker not there yet: ask again
                return None
            lacking = ray_private.locality_missing()
            table, waits = ray_private.LOCALITY_NAMES
            self._waits = waits not in lacking
            read = self._read = None if table in lacking else ray_private.locations_reader()
            self._ref_type = ray_private.ref_type()
            self.node = ray_private.node_id()
            if lacking:
                self._said(lacking)
        return read

    # -- one object ----------------------------------------------------------------------
    def place(self, ref, loc) -> tuple:
        """(locality, size, from_node) of one object from its location entry."""
        if loc is None:
            return (UNKNOWN, 0, None)
        nodes, size = loc["node_ids"], loc["object_size"] or 0
        if nodes:
            if self.node in nodes:  # here, in memory or (did_spill) maybe on disk only
                if loc.get("did_spill") and ref.binary() not in self._pulled:
                    return (SPILLED, size, None)
                return (LOCAL, size, None)
            if ref.binary() in self._pulled:
                return (LOCAL, size, None)
            return (REMOTE, size, nodes[0])
        if loc.get("did_spill"):
            return (SPILLED, size, None)
        if loc["object_size"] is None:  # known by id alone (a task's argument by ref)
            return (UNKNOWN, size, None)
        return (LOCAL, size, None)

    def places(self, refs) -> list | None:
        """Each ref's place now (None: Ray cannot tell)."""
        read = self._reader()
        if read is None or not all(isinstance(r, self._ref_type) for r in refs):
            return None
        found = read(refs)
        return [self.place(ref, found.get(ref)) for ref in refs]

    # -- a get ---------------------------------------------------------------------------
    def before(self, refs) -> Look:
        """Where a get's objects are now (read just before Ray's get runs). Every line runs
        on each get: the one-ref case, the common one, makes no list but Ray's argument."""
        start = perf_counter()
        one = type(refs) is self._ref_type
        refs = [refs] if one else (list(refs) if isinstance(refs, (list, tuple)) else [refs])
        read = self._reader()
        if read is None or not (one or all(isinstance(r, self._ref_type) for r in refs)):
            return Look(start, refs, None)  # not refs: Ray's get raises (Ray's lookup crashes)
        found = read(refs)
        look = Look(start, refs, None)
        places = look.places = []
        for ref in refs:
            loc = found.get(ref)
            if loc is not None and loc["object_size"] is None and not loc["node_ids"]:
                if not self._waits:  # not made yet, and Ray will not say when it is
                    places.append((UNKNOWN, 0, None))
                    look.blind = True
                    continue
                places.append(None)  # not made yet: noted when it is
                look.cancels.append(ray_private.on_ready(ref, self._noter(look)))
            else:
                places.append(self.place(ref, loc))
        return look

    @staticmethod
    def _noter(look):
        def ready(exc):  # on Ray's thread: the time only (list.append is atomic)
            look.ready.append(perf_counter())
        return ready

    def after(self, look: Look, dt: float, nbytes: int, deserialize_s: float):
        """(data seconds, moved) of a get that returned: moved is ((locality, bytes,
        from_node), ...) adding up to nbytes, Ray's sizes of what it deserialized."""
        places = look.places
        if places is None:
            return deserialize_s, ((UNKNOWN, nbytes, None),)
        if look.blind:
            data = deserialize_s
        elif look.cancels:  # some object did not exist at the start: the tail only
            data = self._tail(look, perf_counter(), len(look.cancels), deserialize_s)
            self._made(look)
        else:
            data = dt
        if len(places) == 1:
            where, _, node = places[0]
            if where is REMOTE or where is SPILLED:
                self._pull(look.refs[0])
            return min(max(data, deserialize_s), dt), ((where, nbytes, node),)
        for ref, (where, _, _) in zip(look.refs, places):
            if where is REMOTE or where is SPILLED:
                self._pull(ref)
        return min(max(data, deserialize_s), dt), split(places, nbytes)

    def _made(self, look) -> None:
        """Where each object the get waited for was made: read after the get, this node
        (which it brought the object to) left out when another node holds it too."""
        places = look.places
        waited = [i for i, p in enumerate(places) if p is None]
        found = self._read([look.refs[i] for i in waited])
        for i in waited:
            ref = look.refs[i]
            loc = found.get(ref)
            if loc is not None and self.node in loc["node_ids"] and len(loc["node_ids"]) > 1:
                loc = dict(loc, node_ids=[n for n in loc["node_ids"] if n != self.node])
            places[i] = self.place(ref, loc)

    @staticmethod
    def _tail(look, end, waited, deserialize_s) -> float:
        """The data part of a get that waited: from its last object's existence to its end;
        a callback Ray has not run yet leaves the deserialization alone."""
        ready = look.ready
        if len(ready) < waited:
            return deserialize_s
        return end - max(max(ready), look.start)

    def _pull(self, ref) -> None:
        pulled = self._pulled
        if len(pulled) >= PULLED_KEEP:
            pulled.clear()
        pulled.add(ref.binary())

    @staticmethod
    def cancel(look: Look | None) -> None:
        """A get that raised: its pending callbacks dropped."""
        for cancel in (look.cancels if look is not None else ()):
            try:
                cancel()
            except Exception:
                pass


def split(places, nbytes: int) -> tuple:
    """((locality, bytes, from_node), ...) of an op's objects, their bytes nbytes in all: one
    place takes them all; otherwise objects elsewhere count their own size and what is left
    is local's (Ray's sizes from the table and from the deserializer agree: tested)."""
    first = places[0] if places else (UNKNOWN, 0, None)
    if all(p[0] == first[0] and p[2] == first[2] for p in places):
        return ((first[0], nbytes, first[2]),)
    elsewhere = [(w, size, node) for w, size, node in places if w is not LOCAL]
    local = max(nbytes - sum(size for _, size, _ in elsewhere), 0)
    return ((LOCAL, local, None), *elsewhere) if local else tuple(elsewhere)


def fetch_locality(moved) -> str:
    """The fetch histogram's locality of an op: its objects' one place, or mixed."""
    first = moved[0][0]
    return first if all(m[0] == first for m in moved) else MIXED
