"""`dpobs demo --backend ray`'s truth: what the driver's own timers and Ray's own accounts
(object sizes and locations, `ray.experimental.get_object_locations`) say each process's Ray
ops did, in the shape truth.merge reads (ray_plane.py runs the workload around it).
"""
from __future__ import annotations

from time import perf_counter

from .. import names as nm
from .truth import Durations


class RayTruth:
    """The driver's account: per (op, method, role, rank) the calls, the driver's own seconds
    around them and the refs they moved, whose sizes Ray reports once the step is over. The
    driver's ops are its own (role driver); ray_args and ray_return, the actor's that served
    the call."""

    def __init__(self, here: str = ""):
        self.here = here  # the driver's NodeID
        self.timed: dict[tuple[str, str], Durations] = {}
        self.refs: dict[tuple, list] = {}  # this step's (ref, source NodeID or None), sized at its end
        self.sized: dict[tuple, list[int]] = {}  # [calls, bytes, keys]
        # {(op, method, role, rank, from NodeID, to NodeID): bytes}: what crossed nodes
        self.crossed: dict[tuple, int] = {}

    def call(self, op: str, method: str, fn, *args, **kwargs):
        t0 = perf_counter()
        out = fn(*args, **kwargs)
        self.timed.setdefault((op, method), Durations()).add(perf_counter() - t0)
        return out

    def moved(self, key: tuple, refs: list, calls: int = 1, to: str | None = None) -> None:
        """`calls` ops of key (op, method, role, rank) moved `refs`; each ref one key. With
        `to` (the NodeID of the process that reads them), where each object is now is read
        first: one with no copy on that node is about to cross from the node holding it."""
        c = self.sized.setdefault(key, [0, 0, 0])
        c[0] += calls
        c[2] += len(refs)
        where = self.ray.experimental.get_object_locations(refs) if to and refs else {}
        self.refs.setdefault(key, []).extend(
            (r, _source(where.get(r, {}).get("node_ids"), to)) for r in refs)

    def counted(self, key: tuple, refs: list) -> None:
        """An op that names refs and moves none of their bytes (ray_wait)."""
        c = self.sized.setdefault(key, [0, 0, 0])
        c[0] += 1
        c[2] += len(refs)

    def size(self, ray) -> None:
        refs = [r for rs in self.refs.values() for r, _ in rs]
        where = ray.experimental.get_object_locations(refs) if refs else {}
        for key, rs in self.refs.items():
            for r, source in rs:
                nbytes = int(where[r]["object_size"])
                self.sized[key][1] += nbytes
                if source is not None:
                    k = (*key, *source)
                    self.crossed[k] = self.crossed.get(k, 0) + nbytes
        self.refs = {}

    def take(self) -> dict:
        out = {"timed": self.timed, "sized": self.sized, "crossed": self.crossed}
        self.timed, self.sized, self.crossed = {}, {}, {}
        return out


def _source(node_ids, to: str):
    """(from, to) NodeIDs when an object held on other nodes only is read on node `to`; None
    when a copy is there already, or when it lives in its owner's memory (small objects Ray
    inlines: they travel inside the call's reply, never through a store)."""
    if not node_ids or to in node_ids:
        return None
    return (node_ids[0], to)


def role_truth(role: str, rank: int, period: dict) -> dict:
    """One process's truth in the shape truth.merge reads, plus `ray`: {(op, method): [calls,
    seconds (None where the workload has no timer: the workers' side), bytes, keys]}; the
    driver's timed ops that move data (not its ray.wait) also as `ops` and `bytes` per op, as
    the other backends' are, and their seconds as its busy and exposed time: its loop makes
    them one after another on the step's own thread."""
    out = {"steps": 0, "step_s": 0.0, "busy_s": 0.0, "exposed_s": 0.0, "bytes": {},
           "ops": {}, "ray": {}, "crossed": {}}
    for (op, method, r, k, src, dst), nbytes in period["crossed"].items():
        if (r, k) == (role, rank):
            out["crossed"][(op, method, src, dst)] = nbytes
    for (op, method, r, k), (calls, nbytes, keys) in period["sized"].items():
        if (r, k) != (role, rank):
            continue
        timed = period["timed"].get((op, method))
        out["ray"][(op, method)] = [calls, None if timed is None else timed.total, nbytes,
                                    keys]
        if timed is not None and op != nm.RAY_WAIT:
            out["ops"].setdefault(op, Durations()).merge(timed)
            out["busy_s"] += timed.total
            out["exposed_s"] += timed.total
            direction = (op, nm.RAY_OPS[op])
            out["bytes"][direction] = out["bytes"].get(direction, 0) + nbytes
    return out
