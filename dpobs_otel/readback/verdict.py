"""Who waits for whom: one line from the queue's numbers, for `dpobs top` and the demo's report.

    producer-bound   consumers wait for rows (their exposed time beyond their busy time,
                     i.e. blocked with none of their reads in flight, at least
                     queue_wait_frac of their steps) and rows are read fresh (mean age
                     under queue_age_steps consumer steps): the store is empty when they look
    consumer-bound   consumers do not wait, and rows age in the store (mean age at least
                     queue_age_steps consumer steps): producers are ahead
    neither          both or none of the two, or no numbers to tell

The thresholds and the roles come from the mixin's Config (mixin/config.py), the numbers from
whatever reads the processes: the consumers' exposed, busy and step seconds and steps, the
mean age of the rows they read (row age on), the rows outstanding and the producers' puts.
Exposed time alone would call a consumer whose own reads are slow a waiting one: its reads
are exposed and busy alike, a wait for rows that are not there is exposed only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .. import names
from ..mixin.config import DEFAULT, Config


@dataclass
class Queue:
    """The numbers one verdict reads (None: not known)."""
    consumer_wait_frac: float | None = None  # (exposed - busy) / step time
    consumer_step_s: float | None = None  # a consumer's mean step time
    row_age_mean_s: float | None = None
    outstanding_rows: float | None = None
    producer_puts: float | None = None

    @property
    def age_steps(self) -> float | None:
        if self.row_age_mean_s is None or not self.consumer_step_s:
            return None
        return self.row_age_mean_s / self.consumer_step_s


def verdict(q: Queue, c: Config = DEFAULT) -> str:
    if q.consumer_wait_frac is None:
        return "neither: no consumer steps to tell who waits"
    waiting = q.consumer_wait_frac >= c.queue_wait_frac
    age = q.age_steps
    if age is None:
        return ("neither: consumers wait, but without row age nothing tells an empty store"
                if waiting else "neither: consumers do not wait (row age off)")
    ageing = age >= c.queue_age_steps
    if waiting and not ageing:
        return (f"producer-bound: consumers wait for rows {q.consumer_wait_frac:.0%} of their "
                f"steps, then read them {age:.2f} steps after their put (an empty store)")
    if ageing and not waiting:
        return (f"consumer-bound: rows age {age:.2f} consumer steps in the store while "
                f"consumers wait for rows {q.consumer_wait_frac:.0%} of their steps")
    return (f"neither: consumers wait for rows {q.consumer_wait_frac:.0%} of their steps, rows "
            f"age {age:.2f} steps")


# The numbers of one process, from its samples: series -> key of `Counts`.
_SERIES = {names.STEP_DURATION_SERIES + "_sum": "step_s",
           names.STEP_DURATION_SERIES + "_count": "steps",
           names.STEP_EXPOSED_SERIES: "exposed_s", names.STEP_BUSY_SERIES: "busy_s",
           names.ROW_AGE_SERIES + "_sum": "age_s", names.ROW_AGE_SERIES + "_count": "aged",
           names.OUTSTANDING_KEYS_SERIES: "outstanding"}


def counts(samples) -> dict[str, float]:
    """One process's cumulative counts the verdict reads, from (name, labels, value)
    samples (a scrape, a Prometheus query); differences of two of these are a window's."""
    out = dict.fromkeys(_SERIES.values(), 0.0)
    out["puts"] = 0.0
    for name, labels, value in samples:
        if name in _SERIES:
            out[_SERIES[name]] += value
        elif name == names.OP_DURATION_SERIES + "_count" and labels.get("op") == "put":
            out["puts"] += value
    return out


def from_processes(procs: list[tuple[str, dict]], c: Config = DEFAULT) -> Queue:
    """The queue's numbers from (role, counts) pairs, one per process (`counts`, or the
    difference of two)."""
    cons = [n for role, n in procs if re.fullmatch(c.consumer_roles, role)]
    prod = [n for role, n in procs if re.fullmatch(c.producer_roles, role)]
    q = Queue(outstanding_rows=sum(n["outstanding"] for _, n in procs),
              producer_puts=sum(n["puts"] for n in prod))
    step_s, steps = sum(n["step_s"] for n in cons), sum(n["steps"] for n in cons)
    if step_s > 0 and steps > 0:
        wait = sum(max(n["exposed_s"] - n["busy_s"], 0.0) for n in cons)
        q.consumer_wait_frac = wait / step_s
        q.consumer_step_s = step_s / steps
    aged = sum(n["aged"] for n in cons)
    if aged > 0:
        q.row_age_mean_s = sum(n["age_s"] for n in cons) / aged
    return q


def counts_of(t) -> dict[str, float]:
    """`counts` from a scrape.ProcessTotals (a process's totals or a window's delta)."""
    put = t.ops.get("put")
    return {"step_s": t.step_seconds, "steps": t.steps, "exposed_s": t.exposed_seconds,
            "busy_s": t.busy_seconds, "age_s": t.row_age_seconds, "aged": t.row_age_rows,
            "outstanding": t.outstanding_keys, "puts": put.calls if put is not None else 0.0}


def per_job_from_prometheus(query, window: str = "5m") -> dict[str, list[tuple[str, dict]]]:
    """job -> [(role, counts per second over the window)] per process, from raw series
    (query(expr) -> [(labels, value)]): rates, since every verdict number is a ratio."""
    by = "sum by (job, node, instance, role)"
    exprs = {key: f"{by} ({name})" if key == "outstanding" else f"{by} (rate({name}[{window}]))"
             for name, key in _SERIES.items()}
    exprs["puts"] = f'{by} (rate({names.OP_DURATION_SERIES}_count{{op="put"}}[{window}]))'
    procs: dict[tuple, dict] = {}
    for key, expr in exprs.items():
        for m, value in query(expr):
            who = tuple(m.get(k, "") for k in ("job", "node", "instance", "role"))
            procs.setdefault(who, dict.fromkeys(exprs, 0.0))[key] += value
    out: dict[str, list] = {}
    for (job, _, _, role), n in procs.items():
        out.setdefault(job, []).append((role, n))
    return out
