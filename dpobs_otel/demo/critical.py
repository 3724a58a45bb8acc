"""The demo's three fractions of step time (DESIGN.md "Time on the critical path"):
op-seconds, busy and exposed, per process and for the job, from the workload's truth, each
process's /metrics and the recording rules; `dpobs compare` prints the job's.

The truth side reads a truth dict's `step_s`, its ops' durations and, when the workload keeps
that clock, CRITICAL_PATH: seconds it saw busy (a call in flight while a step was open) and
exposed (a step blocked waiting for data). Without them the truth shows op-seconds alone."""
from __future__ import annotations

from .. import names as nm

CRITICAL_PATH = ("busy_s", "exposed_s")
SERIES = (f"{nm.OP_DURATION_SERIES}_sum", nm.STEP_BUSY_SERIES, nm.STEP_EXPOSED_SERIES)
RULES = ((nm.INSTANCE_FRAC_OF_STEP, nm.INSTANCE_BUSY_FRAC_OF_STEP,
          nm.INSTANCE_EXPOSED_FRAC_OF_STEP),
         (nm.JOB_FRAC_OF_STEP, nm.JOB_BUSY_FRAC_OF_STEP, nm.JOB_EXPOSED_FRAC_OF_STEP))
Fractions = tuple  # (op-seconds, busy, exposed) over step time, None where unknown


def _truth_seconds(t: dict) -> tuple:
    """(step, op-seconds, busy, exposed) of a truth dict; None where it keeps no clock."""
    return (t["step_s"], sum(d.total for d in t["ops"].values()),
            *(t.get(k) for k in CRITICAL_PATH))


def _metric_seconds(samples) -> tuple:
    """(step, op-seconds, busy, exposed) from a process's samples; None for a series it
    does not serve (a process without the counters)."""
    served = {n for n, _, _ in samples}
    step = sum(v for n, _, v in samples if n == f"{nm.STEP_DURATION_SERIES}_sum")
    return (step, *(sum(v for n, _, v in samples if n == s) if s in served else None
                    for s in SERIES))


def _over_step(parts: list[tuple]) -> Fractions:
    """Sums over processes, then divides by their summed step time (as the rules do)."""
    step = sum(p[0] for p in parts)
    if not step:
        return None, None, None
    return tuple(None if any(p[i] is None for p in parts) else sum(p[i] for p in parts) / step
                 for i in (1, 2, 3))


def fractions(t: dict) -> Fractions:
    return _over_step([_truth_seconds(t)])


def _rule_fractions(stack) -> tuple[dict, Fractions]:
    """The recording rules' fractions: {instance: Fractions} and the job's."""
    if stack is None:
        return {}, (None, None, None)
    per = [{r["metric"].get("instance"): r["value"] for r in stack.query(e)} for e in RULES[0]]
    job = tuple(next((r["value"] for r in stack.query(e)), None) for e in RULES[1])
    return {i: tuple(p.get(i) for p in per) for i in per[0]}, job


def critical_path_lines(res, stack) -> list[str]:
    """The three fractions per process and for the job: truth and /metrics over every step,
    truth and the recording rules over the measured steps (the ones Prometheus rates).
    `res`: the demo's report.Result; `stack`: its Stack, or None."""
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
             "(overlaps add up), busy = a call in flight, exposed = the step waited on data",
             f"  {'process':<12}{'span':<16}{'source':<9}{'op-s':>9}{'busy':>9}{'exposed':>9}"]
    keys = sorted(res.info, key=lambda k: -(fractions(res.total(k))[0] or 0.0))
    for k in keys:
        block(f"{k[0]} {k[1]}", rows([res.total(k)], [res.scraped[k]], [res.truth[k]],
                                     per.get(res.info[k]["instance"], (None,) * 3)))
    block("job", rows([res.total(k) for k in keys], [res.scraped[k] for k in keys],
                      [res.truth[k] for k in keys], job))
    if stack is not None:
        stalled = next((r["value"] for r in stack.query(nm.JOB_MAX_EXPOSED_FRAC_OF_STEP)), None)
        lines.append(f"  most stalled process, exposed ({nm.JOB_MAX_EXPOSED_FRAC_OF_STEP}): "
                     + ("-" if stalled is None else f"{stalled:.1%}"))
    return lines
