"""`dpobs top`'s lines of Ray's object store (DESIGN.md, "Ray's object store as a data plane"):
per job, op and method the seconds and bytes each step pays (dispatch: ray_put, ray_call;
collect: ray_get; the workers' side: ray_args, ray_return), the bytes each process owns, and
each Ray node's store: the used fraction of its shared memory and the bytes it spills per
second, where Ray's own node series are scraped. Read from the recording rules
(mixin/ray_rules.py): a job without Ray ops has no lines, and the view prints no table."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import names

PROCESS = names.PROCESS_IDENTITY


@dataclass
class RayLine:
    job: str
    op: str
    method: str  # "" for ops without one (ray_put, ray_wait)
    seconds_per_step: float | None = None
    bytes_per_step: float | None = None  # both directions


@dataclass
class Owned:
    job: str
    role: str
    rank: str
    instance: str
    bytes: float


@dataclass
class Node:
    job: str
    node: str
    used: float | None = None  # shared memory in use / capacity
    spilled_per_s: float | None = None  # bytes


@dataclass
class RayAccount:
    lines: list[RayLine] = field(default_factory=list)  # by job, op, method
    owned: list[Owned] = field(default_factory=list)  # largest first
    nodes: list[Node] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.lines or self.owned or self.nodes)


def from_prometheus(query) -> RayAccount:
    """The account from a Prometheus's records (query(expr) -> [(labels, value)])."""
    lines: dict[tuple[str, str, str], RayLine] = {}

    def line(m: dict) -> RayLine:
        key = (m.get("job", ""), m.get("op", ""), m.get(names.RAY_METHOD, ""))
        return lines.setdefault(key, RayLine(*key))
    for m, v in query(names.JOB_OP_METHOD_RAY_SECONDS_PER_STEP):
        if math.isfinite(v):
            line(m).seconds_per_step = v
    for m, v in query(names.JOB_OP_METHOD_DIRECTION_RAY_BYTES_PER_STEP):
        if math.isfinite(v):
            x = line(m)
            x.bytes_per_step = (x.bytes_per_step or 0.0) + v
    owned = [Owned(m.get("job", ""), m.get("role", ""), m.get("rank", ""),
                   m.get("instance", ""), v)
             for m, v in query(names.INSTANCE_RAY_OWNED_BYTES) if math.isfinite(v) and v > 0]
    nodes: dict[tuple[str, str], Node] = {}
    for attr, expr in (("used", names.JOB_NODE_RAY_STORE_USED),
                       ("spilled_per_s", names.JOB_NODE_RAY_SPILLED_BYTES)):
        for m, v in query(expr):
            if math.isfinite(v):
                key = (m.get("job", ""), m.get("node", ""))
                setattr(nodes.setdefault(key, Node(*key)), attr, v)
    return RayAccount(sorted(lines.values(), key=lambda x: (x.job, x.op, x.method)),
                      sorted(owned, key=lambda o: (-o.bytes, o.job, o.role, o.rank)),
                      sorted(nodes.values(), key=lambda x: (x.job, x.node)))
