"""The report's time on the critical path: per process, the three fractions of step time
(op-seconds, busy, exposed; DESIGN.md "Time on the critical path") from the workload's own
clock beside each process's counters."""
from __future__ import annotations

from .. import names as nm

COLUMNS = (("op-seconds", "dp"), ("busy", "busy_s"), ("exposed", "exposed_s"))


def counters(samples) -> dict[str, float]:
    """Step, op, busy and exposed seconds from one process's scraped samples."""
    want = {f"{nm.STEP_DURATION_SERIES}_sum": "step_s", f"{nm.OP_DURATION_SERIES}_sum": "dp",
            nm.STEP_BUSY_SERIES: "busy_s", nm.STEP_EXPOSED_SERIES: "exposed_s"}
    out = dict.fromkeys(want.values(), 0.0)
    for name, _labels, value in samples:
        if name in want:
            out[want[name]] += value
    return out


def critical_lines(totals: dict, scraped: dict, dp_seconds) -> list:
    """Lines of the report: each process's truth over every step (totals[key]) beside its
    counters (scraped[key]); dp_seconds(truth) is its op-seconds."""
    head = "".join(f"{c + ' truth':>17}{'metrics':>9}" for c, _ in COLUMNS)
    lines = ["\nTime on the critical path, per process, every step: fractions of step time "
             "(op-seconds add up overlapping ops; busy: an op in flight; exposed: the step "
             "thread blocked on data)", f"  {'process':<12}{head}"]
    for key in sorted(totals, key=lambda k: -totals[k]["exposed_s"]):
        t, m = totals[key], counters(scraped[key])
        truth = {"dp": dp_seconds(t), "busy_s": t["busy_s"], "exposed_s": t["exposed_s"]}
        cells = "".join(f"{_frac(truth[k], t['step_s']):>17}{_frac(m[k], m['step_s']):>9}"
                        for _, k in COLUMNS)
        lines.append(f"  {key[0] + ' ' + str(key[1]):<12}{cells}")
    return lines


def _frac(seconds: float, step_s: float) -> str:
    return format(seconds / step_s, ".1%") if step_s else "-"
