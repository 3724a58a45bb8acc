"""The one-line verdict of a job (DESIGN.md "Command line", `dpobs report`), the same sentence
in `dpobs report`, at the top of `dpobs top`'s frame and of the demo's output:

    data plane 12.3% of the step (exposed 4.5%), most in get on trainer 1; guard: checked
    2048 rows, mismatched 0

    data plane   the job's data-plane op-seconds over its step seconds (the recording rule
                 job:dpobs_frac_of_step), and the exposed seconds over the same
    most in OP   the op with the largest share of the job's data-plane time
    on PROCESS   the process ("role rank") with the largest data-plane fraction of its step
    guard        the wire guard's rows checked and mismatched (the window's), or "off"

`sentence` builds it from `Numbers`; each reader fills those from what it already read:
`from_rules` (a Prometheus with dpobs's recording rules, as `dpobs top` reads them),
`from_deltas` (a window of the cluster view's processes, as `dpobs report --sd-dir` reads
them) and `from_parts` (per-op and per-process values a caller holds, as `dpobs top`'s
model). (readback/verdict.py is another line: who waits for whom in a queue.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import names


@dataclass
class Numbers:
    """What the sentence says; None: not known (no steps, the guard off)."""
    frac: float | None = None
    exposed: float | None = None
    op: str | None = None
    process: str | None = None
    checked: float | None = None
    mismatched: float | None = None


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def sentence(n: Numbers) -> str:
    if n.frac is None:
        plane = "data plane: no step measured yet"
    else:
        plane = f"data plane {_pct(n.frac)} of the step (exposed {_pct(n.exposed)})"
    if n.op:
        plane += f", most in {n.op}" + (f" on {n.process}" if n.process else "")
    guard = ("guard: off" if n.checked is None else
             f"guard: checked {n.checked:.0f} rows, mismatched {n.mismatched or 0:.0f}")
    return f"{plane}; {guard}"


def _largest(values: dict[str, float]) -> str | None:
    """The key of the largest finite positive value; ties by name, so the line is stable."""
    found = [(-v, k) for k, v in values.items() if v is not None and math.isfinite(v) and v > 0]
    return min(found)[1] if found else None


def from_parts(frac: float | None, exposed: float | None, op_share: dict[str, float],
               process_frac: dict[str, float], checked: float | None,
               mismatched: float | None) -> Numbers:
    return Numbers(frac, exposed, _largest(op_share), _largest(process_frac), checked,
                   mismatched)


def who(labels: dict) -> str:
    """A process as the sentence names it: role and rank."""
    return f"{labels.get('role', '?')} {labels.get('rank', '?')}"


def from_deltas(deltas) -> Numbers:
    """From (labels, ProcessTotals) per process (readback/cluster.py's Window.deltas values):
    the job's sums, as the recording rules take them."""
    step_s = sum(d.step_seconds for _, d in deltas)
    op_s: dict[str, float] = {}
    procs: dict[str, float] = {}
    exposed = 0.0
    guarded = [d.guard for _, d in deltas if d.guard is not None]
    for labels, d in deltas:
        for op, o in d.ops.items():
            op_s[op] = op_s.get(op, 0.0) + o.seconds
        if d.step_seconds > 0:
            procs[who(labels)] = sum(o.seconds for o in d.ops.values()) / d.step_seconds
        exposed += d.exposed_seconds
    ratio = (lambda x: x / step_s) if step_s > 0 else (lambda x: None)
    return from_parts(ratio(sum(op_s.values())), ratio(exposed), op_s, procs,
                      sum(g.get("rows_checked", 0.0) for g in guarded) if guarded else None,
                      sum(g.get("rows_mismatched", 0.0) for g in guarded) if guarded else None)


def from_rules(prom, job: str) -> Numbers:
    """From the recording rules of one job, read through `prom` (readback/prometheus.py's
    client): the rules `dpobs top` reads."""
    sel = f'{{job="{job}"}}'

    def query(expr: str) -> list[tuple[dict, float]]:
        return [(r["metric"], r["value"]) for r in prom.query(expr)]

    def one(rule: str) -> float | None:
        values = [v for _, v in query(rule + sel) if math.isfinite(v)]
        return values[0] if values else None

    return from_parts(one(names.JOB_FRAC_OF_STEP), one(names.JOB_EXPOSED_FRAC_OF_STEP),
                      {m.get("op", "?"): v for m, v in query(names.JOB_OP_SHARE + sel)},
                      {who(m): v for m, v in query(names.INSTANCE_FRAC_OF_STEP + sel)},
                      one(names.JOB_GUARD_CHECKED), one(names.JOB_GUARD_MISMATCHED))
