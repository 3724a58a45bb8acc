"""`dpobs top`'s weight-sync lines: one per process and side that has synced weights, from
either source. The file_sd source turns each process's window of counters into lines
(`from_window`); the Prometheus source asks for the same numbers per process over 5m with
the PromQL the recording rules are built from (`from_prometheus`), so both agree with the
dashboards. `judged` then tells each receiver how far it is behind its job's newest sender,
DpobsWeightsStale's test (without its `for:`)."""
from __future__ import annotations

from dataclasses import dataclass

from .. import names
from ..mixin import rules
from ..mixin.config import DEFAULT
from ..readback.weights import WeightTotals

SEND, RECEIVE = names.WEIGHT_SIDES
PROCESS = names.PROCESS_IDENTITY


@dataclass
class WeightLine:
    job: str
    role: str
    rank: str
    node: str
    instance: str
    side: str
    version: float | None = None  # of the last completed sync, now
    behind: float | None = None  # receivers: versions behind the job's newest sender
    mean_s: float | None = None  # per sync, over the window
    bytes_per_s: float | None = None  # per second of syncing, not of wall time
    step_share: float | None = None  # sync time in steps / step time (syncs inside steps)
    checked: float | None = None  # receivers with the guard on: tensors, over the window
    mismatched: dict[str, float] | None = None  # reason -> tensors, over the window


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def from_window(p, w: WeightTotals | None, step_seconds: float) -> list[WeightLine]:
    """The lines of process `p` (a model.Process) from its window of weight counters and
    the step seconds in that window."""
    if w is None:
        return []
    share = None if w.step_seconds is None else _ratio(w.step_seconds, step_seconds)
    out = []
    for side, s in w.sides.items():
        line = WeightLine(p.job, p.role, p.rank, p.node, p.instance, side, s.version,
                          mean_s=_ratio(s.seconds, s.syncs),
                          bytes_per_s=_ratio(s.bytes, s.seconds), step_share=share)
        if side == RECEIVE and (w.checked is not None or w.mismatched):
            line.checked, line.mismatched = w.checked, dict(w.mismatched)
        out.append(line)
    return out


# Line attribute -> its query: per process and side, then per process (rules.py's PromQL).
SIDE_QUERIES = {"version": names.WEIGHTS_VERSION_SERIES,
                "mean_s": rules.weights_mean(DEFAULT, *PROCESS, "side"),
                "bytes_per_s": rules.weights_bandwidth(DEFAULT, *PROCESS, "side")}
PROCESS_QUERIES = {"step_share": rules.per_process(DEFAULT, names.STEP_WEIGHT_SYNC_SERIES),
                   "checked": rules.counted(DEFAULT, names.WEIGHTS_CHECKED_SERIES, *PROCESS)}
MISMATCHED = rules.counted(DEFAULT, names.WEIGHTS_MISMATCHED_SERIES, *PROCESS, "reason")


def from_prometheus(query) -> list[WeightLine]:
    """The lines from a Prometheus's raw series (query(expr) -> [(labels, value)])."""
    lines: dict[tuple, WeightLine] = {}
    for attr, expr in SIDE_QUERIES.items():
        for m, v in query(expr):
            key = (_process(m), m.get("side", ""))
            if key not in lines:
                lines[key] = WeightLine(*(m.get(k, "") for k in _FIELDS))
            setattr(lines[key], attr, v)
    for attr, expr in PROCESS_QUERIES.items():
        for m, v in query(expr):
            for line in _of(lines, m, RECEIVE if attr == "checked" else None):
                setattr(line, attr, v)
    for m, v in query(MISMATCHED):
        for line in _of(lines, m, RECEIVE):
            line.mismatched = line.mismatched or {}
            line.mismatched[m.get("reason", "")] = v
    return list(lines.values())


_FIELDS = ("job", "role", "rank", "node", "instance", "side")  # WeightLine's first six


def _process(labels: dict) -> tuple[str, ...]:
    return tuple(labels.get(k, "") for k in PROCESS)


def _of(lines: dict, labels: dict, side: str | None) -> list[WeightLine]:
    """The lines of the process `labels` name (of one side only, when given)."""
    who = _process(labels)
    return [line for (w, s), line in lines.items() if w == who and side in (None, s)]


def judged(lines: list[WeightLine]) -> list[WeightLine]:
    """The lines, each receiver's `behind` set against its job's newest sender version,
    ordered by job, senders first, then role, rank, node and instance."""
    newest: dict[str, float] = {}
    for line in lines:
        if line.side == SEND and line.version is not None:
            newest[line.job] = max(newest.get(line.job, line.version), line.version)
    for line in lines:
        if line.side == RECEIVE and line.version is not None and line.job in newest:
            line.behind = newest[line.job] - line.version
    return sorted(lines, key=lambda x: (x.job, x.side != SEND, x.role, x.rank, x.node,
                                        x.instance, x.side))
