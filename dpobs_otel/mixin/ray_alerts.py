"""The alerts of Ray's object store (DESIGN.md "Alerts") and of where Ray's bytes travel
("Moving data versus waiting (Ray)"), from the records of ray_rules.py and the Config's
knobs; docs/runbook.md has a section for each."""
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


def _query(expr: str, *args: str) -> str:
    """A Go-template query of another series from an alert's description."""
    return f'printf "{expr}" {" ".join(args)} | query'


def _hub(c: Config) -> Rule:
    moved, share = n.INSTANCE_RAY_MOVED, c.ray_hub_share
    expr = (f"{n.JOB_RAY_HUB_SHARE} > {share:g}\n"
            f"  and {c.on('job')}\n"
            f"count {c.by('job')} ({moved} > 0) >= {c.ray_hub_min_processes}\n"
            f"  and {c.on('job')}\n"
            f"sum {c.by('job')} ({moved}) >= {c.ray_hub_min_bytes:.0f}\n")
    top = _query(f"topk(1, {moved}" + "{job=%q})", "$labels.job")
    total = _query(f"sum({moved}" + "{job=%q})", "$labels.job")
    return alert(
        c, n.ALERT_RAY_HUB, "info", expr, c.ray_hub_for,
        "One process moves most of its job's Ray bytes: every batch passes through it.",
        "{{ with " + top + " }}{{ with . | first }}{{ .Labels.role }} rank {{ .Labels.rank }}"
        " ({{ .Labels.instance }}){{ end }}{{ end }} takes part in"
        " {{ $value | humanizePercentage }} of the Ray bytes job {{ $labels.job }} moves"
        " ({{ with " + total + " }}{{ . | first | value | humanize1024 }}B/s{{ end }} over"
        " the last 5m): its network link, its object store and its serializer carry every"
        " batch, and its time grows with the job.",
        f"Info: a single controller is a design, not a fault, until it is the slowest part.\n"
        f"Only in a job of {c.ray_hub_min_processes}+ processes moving Ray bytes (with fewer,"
        f" one of them\nnecessarily moves most) and at least {c.ray_hub_min_bytes / 1e6:g} MB/s"
        " through Ray.",
        threshold=f">{share:g}")


def _transfer_slow(c: Config) -> Rule:
    bandwidth, floor = c.ray_transfer_slow_bandwidth, c.ray_transfer_slow_min_bytes
    into = f"sum {c.by('job', 'node')} ({n.JOB_FROM_NODE_NODE_RAY_REMOTE})"
    expr = (f"{n.JOB_NODE_RAY_FETCH_BANDWIDTH} < {bandwidth:.0f}\n"
            f"  and {c.on('job', 'node')}\n{into} >= {floor:.0f}\n")
    pulled = _query(f"sum({n.JOB_FROM_NODE_NODE_RAY_REMOTE}" + "{job=%q,node=%q})",
                    "$labels.job", "$labels.node")
    source = _query(f"topk(1, {n.JOB_FROM_NODE_NODE_RAY_REMOTE}" + "{job=%q,node=%q})",
                    "$labels.job", "$labels.node")
    return alert(
        c, n.ALERT_RAY_TRANSFER_SLOW, "warning", expr, c.ray_transfer_slow_for,
        "Ray's transfers into a node are slow: objects pulled from other nodes arrive slowly.",
        "Remote fetches into Ray node {{ $labels.node }} of job {{ $labels.job }} ran at"
        " {{ $value | humanize1024 }}B/s over the last 5m (below "
        f"{bandwidth / 1e6:g} MB/s), while it pulled"
        " {{ with " + pulled + " }}{{ . | first | value | humanize1024 }}B/s{{ end }} from"
        " other nodes, most from {{ with " + source + " }}{{ with . | first }}"
        "{{ .Labels.from_node }}{{ end }}{{ end }}.",
        "Bytes per second of fetching, not of wall time: a node that pulls little but fast\n"
        "is fine, one whose gets spend their data time pulling at a trickle is not. The floor\n"
        "on the bytes keeps a node that pulls a few small objects (fixed costs dominate)\n"
        "quiet.",
        threshold=f"<{bandwidth:.0f}")


def ray_alerts(c: Config) -> list[Rule]:
    return [_spilling(c), _full(c), _hub(c), _transfer_slow(c)]
