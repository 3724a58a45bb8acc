"""The two alerts of Ray's object store (DESIGN.md "Alerts"), from the records of ray_rules.py
and the Config's knobs; docs/runbook.md has a section for each."""
from __future__ import annotations

from .. import names as n
from .config import Config
from .render import Rule, alert
from .rules import counted


def _spilling(c: Config) -> Rule:
    running = (f"sum {c.by('job')} ({n.JOB_OP_METHOD_SECONDS}) > 0\n"
               f"    or\n  {n.JOB_STEP_SECONDS} > 0")
    return alert(
        c, n.ALERT_RAY_STORE_SPILLING, "warning",
        f"{n.JOB_NODE_RAY_SPILLED_OBJECTS} > 0\n  and {c.on('job')}\n(\n  {running}\n)\n",
        c.ray_spilling_for,
        "Ray's object store spills objects to disk while the job's Ray ops run.",
        "Node {{ $labels.node }} of job {{ $labels.job }} spilled"
        ' {{ $value | printf "%.3g" }} objects/s over the last 5m, and has kept spilling for'
        f" {c.ray_spilling_for} while the job's Ray ops or steps ran: the objects in flight"
        " do not fit its object store, so puts and gets wait on disk.",
        "Only while the job works: a store that spilled what an idle job left behind is no\n"
        "step's cost. The `for:` asks for spills in every 5m window of it: spilling that\n"
        "recurs, step after step, not one burst.")


def _full(c: Config) -> Rule:
    refused = counted(c, n.OP_ERRORS_SERIES, "job", where=(
        c.ray_ops, f'error_type=~".*({c.ray_store_full_errors}).*"'))
    used, frac, for_ = n.JOB_NODE_RAY_STORE_USED, c.ray_store_full_frac, c.ray_store_full_for
    expr = (f"{refused} > 0\n  or\n"
            f"(\n  min_over_time({used}[{for_}]) > {frac:g}\n"
            f"    and {c.on('job', 'node')}\n  {used} offset {for_}\n)\n")
    return alert(
        c, n.ALERT_RAY_STORE_FULL, "warning", expr, None,
        "Ray's object store is full: puts are refused, or it stays near its capacity.",
        "{{ with $labels.node }}The object store of node {{ . }} in job {{ $labels.job }} has"
        " been above " + f"{frac:.0%} of its capacity for {for_} (at least"
        " {{ $value | humanizePercentage }} throughout).{{ else }}Ray refused"
        " {{ $value | humanize }} op(s) of job {{ $labels.job }} in the last 5m for want of"
        " room (" + " or ".join(n.RAY_STORE_FULL_ERRORS) + "); the program saw the"
        " exception.{{ end }}",
        "No `for:`: a refused put already failed the program's call. The store's fullness\n"
        f"carries its own duration instead: above the knob at every evaluation of the last\n"
        f"{for_}, and recorded {for_} ago (so a Prometheus that just started does not take a\n"
        "few minutes of history for the whole window). Per job for a refusal, per node for\n"
        "fullness.",
        threshold=f">{frac:g}")


def ray_alerts(c: Config) -> list[Rule]:
    return [_spilling(c), _full(c)]
