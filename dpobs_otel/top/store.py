"""`dpobs top`'s lines of the store's own account (issue 33; docs/guides/transferqueue.md "The
store's own account"): per job and op, the server share (the store's seconds for the op's
requests / the clients' seconds in it) and the coverage (calls the measured clients made /
calls the store served), and the job's coverage over all ops. Read from the recording rules
(mixin/store_rules.py), which exist only where the job's store exporter is scraped (its
`tq-controller` target): a job without one has no lines, and the view prints no table."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import names

ALL_OPS = "all ops"  # the op cell of a job's coverage over every covered op


@dataclass
class StoreLine:
    job: str
    op: str  # a dpobs op; coverage pools reads (get and get_data) as get
    server_share: float | None = None  # above 1 where storage units serve a call in parallel
    made_per_s: float | None = None  # calls the measured clients made
    served_per_s: float | None = None  # calls the store served
    coverage: float | None = None  # made / served

    @property
    def client_share(self) -> float | None:
        """The client side's part of the op's time: 1 - server share, at least 0 (the
        dashboard's stacked split clamps the same way)."""
        return None if self.server_share is None else max(0.0, 1.0 - self.server_share)


# StoreLine attribute -> the recording rule (one series per job and op).
OP_RULES = {"server_share": names.JOB_OP_STORE_SERVER_SHARE,
            "made_per_s": names.JOB_OP_STORE_MADE,
            "served_per_s": names.JOB_OP_STORE_SERVED,
            "coverage": names.JOB_OP_STORE_COVERAGE}
JOB_COVERAGE = names.JOB_STORE_COVERAGE


def from_prometheus(query) -> list[StoreLine]:
    """The lines from a Prometheus's records (query(expr) -> [(labels, value)]), by job and
    op, each job's coverage over all ops last."""
    lines: dict[tuple[str, str], StoreLine] = {}

    def line(job: str, op: str) -> StoreLine:
        return lines.setdefault((job, op), StoreLine(job, op))
    for attr, expr in OP_RULES.items():
        for m, v in query(expr):
            if math.isfinite(v):
                setattr(line(m.get("job", ""), m.get("op", "")), attr, v)
    for m, v in query(JOB_COVERAGE):
        if math.isfinite(v):
            line(m.get("job", ""), ALL_OPS).coverage = v
    return sorted(lines.values(), key=lambda s: (s.job, s.op == ALL_OPS, s.op))
