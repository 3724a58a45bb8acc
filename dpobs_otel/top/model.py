"""The answers `dpobs top` shows, whichever source computed them: the recording rules of a
Prometheus, or top's own differencing of scrapes taken straight from the endpoints.

A value is None when the source has no answer for it (no traffic in the window, a process
that is down, a window that is still filling); the view prints a dash, never a made-up 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Process:
    job: str
    instance: str
    role: str = ""
    rank: str = ""
    node: str = ""
    up: bool = True
    frac_of_step: float | None = None  # data-plane seconds / step seconds in the window
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
    read_bytes_per_s: float | None = None
    write_bytes_per_s: float | None = None
    outstanding_bytes: float | None = None
    guard_checked: float | None = None  # rows, increase over the window
    guard_mismatched: float | None = None
    ops: list[Op] = field(default_factory=list)  # largest share first


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
    error: str = ""  # the source itself failed (e.g. Prometheus unreachable)


def worst_first(procs: list[Process]) -> list[Process]:
    """Highest frac_of_step first; processes without an answer (down, idle) after them,
    down ones last, so the eye lands on the bottleneck and the broken ones alike."""
    def key(p: Process):
        return (not p.up, p.frac_of_step is None, -(p.frac_of_step or 0.0), p.job, p.role,
                p.rank, p.instance)
    return sorted(procs, key=key)
