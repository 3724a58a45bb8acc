"""The report's time on the critical path: the three fractions of step time (op-seconds,
busy, exposed; DESIGN.md "Time on the critical path"), per process and for the job, from the
workload's own clock, each process's counters and the recording rules; `dpobs compare`
prints the job's."""
from __future__ import annotations

from .. import names as nm

CRITICAL_PATH = ("busy_s", "exposed_s")  # a truth dict's busy and exposed seconds
RULES = ((nm.INSTANCE_FRAC_OF_STEP, nm.INSTANCE_BUSY_FRAC_OF_STEP,
          nm.INSTANCE_EXPOSED_FRAC_OF_STEP),
         (nm.JOB_FRAC_OF_STEP, nm.JOB_BUSY_FRAC_OF_STEP, nm.JOB_EXPOSED_FRAC_OF_STEP))


def counters(samples) -> dict[str, float]:
    """Step, op, busy and exposed seconds from one process's scraped samples."""
    want = {f"{nm.STEP_DURATION_SERIES}_sum": "step_s", f"{nm.OP_DURATION_SERIES}_sum": "dp",
            nm.STEP_BUSY_SERIES: "busy_s", nm.STEP_EXPOSED_SERIES: "exposed_s"}
    out = dict.fromkeys(want.values(), 0.0)
    for name, _labels, value in samples:
        if name in want:
            out[want[name]] += value
    return out


def _truth_seconds(t: dict) -> tuple:
    """(step, op-seconds, busy, exposed) of a truth dict."""
    return (t["step_s"], sum(d.total for d in t["ops"].values()),
            *(t[k] for k in CRITICAL_PATH))


def _metric_seconds(samples) -> tuple:
    c = counters(samples)
    return c["step_s"], c["dp"], c["busy_s"], c["exposed_s"]


def _over_step(parts: list[tuple]) -> tuple:
    """(op-seconds, busy, exposed) summed over processes, then over their summed step time
    (as the rules do); Nones without a step."""
    step = sum(p[0] for p in parts)
    if not step:
        return None, None, None
    return tuple(sum(p[i] for p in parts) / step for i in (1, 2, 3))


def fractions(t: dict) -> tuple:
    """(op-seconds, busy, exposed) over step time of a truth dict."""
    return _over_step([_truth_seconds(t)])


def _rule_fractions(stack) -> tuple[dict, tuple]:
    """The recording rules' fractions: {instance: (op-s, busy, exposed)} and the job's;
    None where a rule has no series."""
    if stack is None:
        return {}, (None, None, None)
    per = [{r["metric"].get("instance"): r["value"] for r in stack.query(e)} for e in RULES[0]]
    job = tuple(next((r["value"] for r in stack.query(e)), None) for e in RULES[1])
    return {i: tuple(p.get(i) for p in per) for i in per[0]}, job


def _lockstep(rows: list) -> bool:
    """Whether the workload's clock and the counters give one figure for all three fractions
    (as shown, to 0.1%): a lockstep process, whose three columns repeat one number."""
    shown = [{format(x, ".1%") for x in fr if x is not None}
             for _span, source, fr in rows if source in ("truth", "metrics")]
    return all(len(cells) <= 1 for cells in shown)


def critical_path_lines(res, stack) -> list[str]:
    """The three fractions per process (most exposed first) and for the job: the workload's
    clock and the counters over every step, its clock and the recording rules over the
    measured steps (the ones Prometheus rates). `res`: report.Result; `stack`: or None."""
    def block(name: str, rows: list) -> None:
        for i, (span, source, fr) in enumerate(rows):
            cells = "".join(f"{'-' if x is None else format(x, '.1%'):>9}" for x in fr)
            lines.append(f"  {name if i == 0 else '':<12}{span:<16}{source:<9}{cells}")

    def rows(total: list, scraped: list, measured: list, rules) -> list:
        out = [("every step", "truth", _over_step([_truth_seconds(t) for t in total])),
               ("", "metrics", _over_step([_metric_seconds(s) for s in scraped])),
               ("measured steps", "truth", _over_step([_truth_seconds(t) for t in measured]))]
        return out + ([("", "rules", rules)] if stack is not None else [])

    per, job = _rule_fractions(stack)
    lines = ["\nTime on the critical path, fraction of step time: op-s = seconds inside calls "
             "(overlaps add up), busy = a call in flight, exposed = the step thread blocked "
             "on data", f"  {'process':<12}{'span':<16}{'source':<9}{'op-s':>9}{'busy':>9}"
             f"{'exposed':>9}"]
    keys = sorted(res.info, key=lambda k: -(fractions(res.total(k))[2] or 0.0))
    blocks = [(f"{k[0]} {k[1]}", rows([res.total(k)], [res.scraped[k]], [res.truth[k]],
                                      per.get(res.info[k]["instance"], (None,) * 3)))
              for k in keys]
    if all(_lockstep(r) for _, r in blocks):
        lines.append("  per process: left out, op-s = busy = exposed on every process by its "
                     "clock and its counters (each call blocks the step thread, none overlap), "
                     "so each is the Processes table's fraction of step; the job:")
        blocks = []
    for name, r in blocks:
        block(name, r)
    block("job", rows([res.total(k) for k in keys], [res.scraped[k] for k in keys],
                      [res.truth[k] for k in keys], job))
    if stack is not None:
        stalled = next((r["value"] for r in stack.query(nm.JOB_MAX_EXPOSED_FRAC_OF_STEP)), None)
        lines.append(f"  most stalled process, exposed ({nm.JOB_MAX_EXPOSED_FRAC_OF_STEP}): "
                     + ("-" if stalled is None else f"{stalled:.1%}"))
    return lines
