"""The answers `dpobs top` shows, whichever source computed them: the recording rules of a
Prometheus, or top's own differencing of scrapes taken straight from the endpoints.

A value is None when the source has no answer for it (no traffic in the window, a process
that is down, a window that is still filling); the view prints a dash, never a made-up 0.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ..mixin.config import DEFAULT
from ..readback import headline
from .ray import RayAccount
from .store import StoreLine
from .weights import WeightLine


@dataclass
class Process:
    job: str
    instance: str
    role: str = ""
    rank: str = ""
    node: str = ""
    up: bool = True
    frac_of_step: float | None = None  # data-plane seconds / step seconds in the window
    busy_frac: float | None = None  # wall time with an op in flight in a step / step time
    exposed_frac: float | None = None  # wall time a step waited on the data plane / step time
    error: str = ""  # why it is down, when the source knows


@dataclass
class Op:
    op: str
    share: float | None = None  # of the job's data-plane time
    ops_per_s: float | None = None
    mean_s: float | None = None
    p90_s: float | None = None
    p99_s: float | None = None
    quantiles: str = ""  # where p90/p99 come from: "native" or "classic" histogram


@dataclass
class Job:
    job: str
    frac_of_step: float | None = None  # all processes: summed data-plane / summed step time
    max_frac_of_step: float | None = None  # the slowest process's
    busy_frac: float | None = None  # summed busy / summed step time
    exposed_frac: float | None = None  # summed exposed / summed step time
    max_exposed_frac: float | None = None  # the most stalled process's
    read_bytes_per_s: float | None = None
    write_bytes_per_s: float | None = None
    outstanding_bytes: float | None = None
    guard_checked: float | None = None  # rows, increase over the window
    guard_mismatched: float | None = None
    queue: str | None = None  # who waits for whom (readback/verdict.py), one line
    ops: list[Op] = field(default_factory=list)  # largest share first


@dataclass
class Straggler:
    """A process whose mean latency of an op is at least `factor` x its role's median."""
    job: str
    role: str
    rank: str
    node: str
    instance: str
    op: str
    mean_s: float
    median_s: float  # of the role's processes, this one included

    @property
    def ratio(self) -> float:
        return self.mean_s / self.median_s


@dataclass
class Alert:
    name: str
    severity: str = ""
    labels: dict = field(default_factory=dict)
    summary: str = ""


@dataclass
class Answers:
    source: str  # what the header says: "prometheus URL" or "file_sd DIR"
    window_s: float | None  # the span the rates cover (None: not yet two scrapes)
    taken_at: float  # wall-clock time of the answers
    processes: list[Process] = field(default_factory=list)  # worst frac_of_step first
    jobs: list[Job] = field(default_factory=list)
    alerts: list[Alert] | None = None  # None: this source cannot know (no Prometheus)
    stragglers: list[Straggler] = field(default_factory=list)  # slowest ratio first
    weights: list[WeightLine] = field(default_factory=list)  # per job, senders first
    store: list[StoreLine] = field(default_factory=list)  # the store's account, by job and op
    ray: RayAccount = field(default_factory=RayAccount)  # Ray's object store (--prometheus)
    error: str = ""  # the source itself failed (e.g. Prometheus unreachable)


def verdict_line(a: Answers, j: Job) -> str:
    """The job's one-line verdict (readback/headline.py) from the numbers top already has."""
    procs = {headline.who({"role": p.role, "rank": p.rank}): p.frac_of_step
             for p in a.processes if p.job == j.job}
    return headline.sentence(headline.from_parts(
        j.frac_of_step, j.exposed_frac, {o.op: o.share for o in j.ops}, procs,
        j.guard_checked, j.guard_mismatched))


def worst_first(procs: list[Process]) -> list[Process]:
    """Highest frac_of_step first; processes without an answer (down, idle) after them,
    down ones last, so the eye lands on the bottleneck and the broken ones alike."""
    def key(p: Process):
        return (not p.up, p.frac_of_step is None, -(p.frac_of_step or 0.0), p.job, p.role,
                p.rank, p.instance)
    return sorted(procs, key=key)


def stragglers(means: list[tuple[dict, float]], factor: float = DEFAULT.straggler_factor,
               min_processes: int = DEFAULT.straggler_min_processes) -> list[Straggler]:
    """DpobsDataPlaneStraggler's test, now (without its `for:`): per (job, role, op), with at
    least min_processes processes, each whose mean latency is at least factor x the median
    of them all (the median of an even count is the mean of the middle two, as PromQL's
    quantile(0.5)). `means`: (labels with the process identity and op, mean seconds)."""
    roles: dict[tuple, list[tuple[dict, float]]] = {}
    for labels, mean in means:
        roles.setdefault((labels.get("job", ""), labels.get("role", ""), labels.get("op", "")),
                         []).append((labels, mean))
    out = []
    for members in roles.values():
        median = statistics.median(m for _, m in members)
        if len(members) < min_processes or median <= 0:
            continue
        out += [Straggler(*(lab.get(k, "") for k in ("job", "role", "rank", "node", "instance",
                                                     "op")), mean, median)
                for lab, mean in members if mean >= factor * median]
    return sorted(out, key=lambda s: (-s.ratio, s.job, s.role, s.op, s.rank))
