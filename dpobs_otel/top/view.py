"""One frame of `dpobs top`, drawn with rich: a header, the firing alerts, the jobs'
answers, each job's ops, the weight syncs (where any process synced weights), the store's own
account (where a job's store exporter is scraped), Ray's object store (where a job has Ray
ops), the processes worst first. Fractions in %,
latencies in ms, bytes in decimal units, all to three significant digits (a fixed number of
decimals would show a slow job's rates as 0.00); a missing answer is '-'."""
from __future__ import annotations

import math
import time

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..mixin.config import DEFAULT
from ..names import PROCESS_IDENTITY
from .model import Answers, verdict_line

UNITS = ("B", "kB", "MB", "GB", "TB")
DASH = "-"
# An alert's labels worth a column of text: which process, and which op or field.
ALERT_LABELS = frozenset((*PROCESS_IDENTITY, "op", "field"))
FACTOR = f"{DEFAULT.straggler_factor:g}x"  # DpobsDataPlaneStraggler's, from the one Config
SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


def sig(x: float, digits: int = 3) -> str:
    """x with `digits` significant digits in fixed point (no exponent): 0.0512, 5.12, 512."""
    if x == 0 or not math.isfinite(x):
        return f"{x:.0f}" if x == 0 else str(x)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:.{min(decimals, 6)}f}"


def pct(x: float | None) -> str:
    return DASH if x is None else f"{x:.1%}"


def ms(x: float | None) -> str:
    return DASH if x is None else sig(x * 1e3)


def size(x: float | None, per: str = "") -> str:
    """Bytes in decimal units (B, kB, MB, GB, TB), three significant digits."""
    if x is None:
        return DASH
    for unit in UNITS:
        if abs(x) < 1000 or unit == UNITS[-1]:
            return f"{sig(x)} {unit}{per}"
        x /= 1000
    raise AssertionError("unreachable")


def count(x: float | None) -> str:
    return DASH if x is None else f"{x:.0f}"


def rate(x: float | None) -> str:
    return DASH if x is None else sig(x)


def _window(s: float | None) -> str:
    if s is None:
        return "window filling"
    return f"window {s / 60:.0f}m" if s >= 120 else f"window {s:.0f}s"


def _table(title: str, *columns: str) -> Table:
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              title_style="bold")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i < 2 or c in ("instance", "node", "state", "role",
                                                          "side") else "right", no_wrap=True)
    return t


def header(a: Answers, every_s: float | None) -> Text:
    stamp = time.strftime("%H:%M:%S", time.localtime(a.taken_at))
    refresh = f" · every {every_s:g}s · Ctrl-C quits" if every_s else ""
    return Text.assemble(("dpobs top", "bold"), f" · {a.source} · {_window(a.window_s)}"
                         f" · {stamp}{refresh}")


# What the three fractions of step time mean, said once under the jobs table.
FRACTIONS = ("frac_of_step: op-seconds (overlaps add up) · busy: a call in flight · "
             "exposed: steps waited on data (the stall)")


def jobs_table(a: Answers) -> Table:
    t = _table("Jobs", "job", "frac_of_step", "slowest proc", "busy", "exposed",
               "most stalled", "read", "write", "outstanding", "guard checked", "mismatched")
    t.caption, t.caption_justify = FRACTIONS, "left"
    for j in a.jobs:
        bad = j.guard_mismatched is not None and j.guard_mismatched > 0
        t.add_row(j.job, pct(j.frac_of_step), pct(j.max_frac_of_step), pct(j.busy_frac),
                  pct(j.exposed_frac), pct(j.max_exposed_frac),
                  size(j.read_bytes_per_s, "/s"), size(j.write_bytes_per_s, "/s"),
                  size(j.outstanding_bytes),
                  count(j.guard_checked),
                  Text(count(j.guard_mismatched), style="bold red" if bad else ""))
    return t


def queue_text(a: Answers) -> Text:
    """One line per job: who waits for whom (readback/verdict.py)."""
    lines = [f"{j.job}: {j.queue}" for j in a.jobs if j.queue]
    return Text("Who waits for whom: " + ("; ".join(lines) or "no answer yet"),
                style="bold" if any(not j.queue.startswith("neither") for j in a.jobs
                                    if j.queue) else "")


def ops_table(a: Answers) -> Table:
    t = _table("Ops (share of data-plane time; p90/p99 from the native histogram where it "
               "exists, else the classic buckets: see `from`)",
               "job", "op", "share", "ops/s", "mean ms", "p90 ms", "p99 ms", "from")
    for j in a.jobs:
        for o in j.ops:
            t.add_row(j.job, o.op, pct(o.share), rate(o.ops_per_s), ms(o.mean_s), ms(o.p90_s),
                      ms(o.p99_s), o.quantiles or "-")
    return t


def processes_table(a: Answers) -> Table:
    down = sum(not p.up for p in a.processes)
    t = _table(f"Processes ({len(a.processes) - down} up, {down} down), worst frac_of_step "
               "first", "job", "role", "rank", "node", "instance", "frac_of_step", "busy",
               "exposed", "state")
    for p in a.processes:
        state = Text("up", style="green") if p.up else Text(
            "DOWN" + (f" ({p.error})" if p.error else ""), style="bold red")
        t.add_row(p.job, p.role, p.rank or DASH, p.node or DASH, p.instance,
                  pct(p.frac_of_step), pct(p.busy_frac), pct(p.exposed_frac), state)
    return t


def mismatches(m: dict[str, float] | None) -> Text:
    """'0', or the reasons that failed with their counts in red; '-' when not checked."""
    if m is None:
        return Text(DASH)
    bad = [f"{reason} {n:.0f}" for reason, n in sorted(m.items()) if n > 0]
    return Text(", ".join(bad), style="bold red") if bad else Text("0")


def weights_table(a: Answers) -> Table | None:
    """One line per process and side that synced weights; None when none did. A receiver
    more than DpobsWeightsStale's versions behind its job's newest sender is in yellow."""
    if not a.weights:
        return None
    t = _table("Weight sync (per process and side; mean, bandwidth and checks over the window)",
               "job", "role", "rank", "node", "instance", "side", "version", "behind",
               "mean s", "bandwidth", "share of step", "checked", "mismatched")
    for w in a.weights:
        stale = w.behind is not None and w.behind > DEFAULT.weights_stale_versions
        t.add_row(w.job, w.role, w.rank or DASH, w.node or DASH, w.instance, w.side,
                  count(w.version), Text(count(w.behind), style="bold yellow" if stale else ""),
                  rate(w.mean_s), size(w.bytes_per_s, "/s"), pct(w.step_share),
                  count(w.checked), mismatches(w.mismatched))
    return t


# What the store's columns mean, said once under its table.
STORE_CAPTION = ("server share: the store's seconds / the clients' seconds · coverage: calls "
                 "measured clients made / calls the store served (get pools get_data)")


def store_table(a: Answers) -> Table | None:
    """The store's own account, one line per job and op; None where no job's store exporter
    is scraped. Coverage under DpobsUnmeasuredClients's threshold is in yellow."""
    if not a.store:
        return None
    t = _table("The store's own account, per op", "job", "op", "server share", "client side",
               "made/s", "served/s", "coverage")
    t.caption, t.caption_justify = STORE_CAPTION, "left"
    for s in a.store:
        low = s.coverage is not None and s.coverage < DEFAULT.unmeasured_coverage
        t.add_row(s.job, s.op, pct(s.server_share), pct(s.client_share), rate(s.made_per_s),
                  rate(s.served_per_s), Text(pct(s.coverage), style="bold yellow" if low else ""))
    return t


RAY_CAPTION = ("per step of the job: dispatch ray_put, ray_call · collect ray_get · the "
               "workers' side ray_args, ray_return (a get's seconds hold the method's run)")


def ray_tables(a: Answers) -> list[Table]:
    """Ray's object store: its ops per method, the bytes each process owns, each node's store
    (where Ray's node series are scraped); nothing where no job has Ray ops."""
    out = []
    if a.ray.lines:
        t = _table("Ray ops per method (per step)", "job", "op", "method", "s/step",
                   "bytes/step")
        t.caption, t.caption_justify = RAY_CAPTION, "left"
        for x in a.ray.lines:
            t.add_row(x.job, x.op, x.method or DASH, rate(x.seconds_per_step),
                      size(x.bytes_per_step))
        out.append(t)
    if a.ray.owned or a.ray.nodes:
        # (a short title: rich wraps a title wider than its table)
        t = _table("Ray store: owned bytes, nodes", "job", "who", "owned", "store used",
                   "spilled/s")
        for o in a.ray.owned:
            t.add_row(o.job, f"{o.role} {o.rank} {o.instance}".strip(), size(o.bytes), DASH,
                      DASH)
        for n in a.ray.nodes:
            full = n.used is not None and n.used >= DEFAULT.ray_store_full_frac
            t.add_row(n.job, f"node {n.node}", DASH,
                      Text(pct(n.used), style="bold yellow" if full else ""),
                      size(n.spilled_per_s, "/s"))
        out.append(t)
    return out


def stragglers_text(a: Answers) -> Table | Text:
    """The processes DpobsDataPlaneStraggler's test names now (before its `for:`)."""
    if not a.stragglers:
        return Text(f"Stragglers: none (no process at {FACTOR} its role's median latency)",
                    style="green")
    t = _table(f"Stragglers: mean latency of an op at {FACTOR} or more its role's median",
               "job", "role", "rank", "node", "instance", "op", "mean ms", "role median ms", "x")
    for s in a.stragglers:
        t.add_row(s.job, s.role, s.rank or DASH, s.node or DASH, s.instance, s.op,
                  ms(s.mean_s), ms(s.median_s), Text(sig(s.ratio), style="bold yellow"))
    return t


def alerts_text(a: Answers) -> Text:
    if a.alerts is None:
        return Text("Alerts: only with --prometheus URL (this source has no rule engine)",
                    style="dim")
    if not a.alerts:
        return Text("Alerts firing: none", style="green")
    out = Text("Alerts firing:\n", style="bold")
    for al in a.alerts:
        where = " ".join(f"{k}={v}" for k, v in sorted(al.labels.items())
                         if k in ALERT_LABELS)
        out.append(f"  {al.name}", style=SEVERITY_STYLE.get(al.severity, "bold"))
        out.append(f" {al.severity} {where}".rstrip() + (f": {al.summary}" if al.summary
                                                          else "") + "\n")
    return out


def frame(a: Answers, every_s: float | None = None) -> Group:
    parts = [header(a, every_s)]
    if a.error:  # the source answered nothing: no empty tables, no "only with" hints
        return Group(*parts, Text(f"source error: {a.error}", style="bold red"))
    # The verdict first: the one line a glance takes away (the same sentence as the report's).
    parts += [Text(f"{j.job}: {verdict_line(a, j)}", style="bold") for j in a.jobs]
    # Alerts above the tables: a terminal too short for every process crops the bottom.
    parts += [alerts_text(a), jobs_table(a), queue_text(a), stragglers_text(a), ops_table(a)]
    # Only where weights are synced, and where a job's store exporter is scraped.
    parts += [t for t in (weights_table(a), store_table(a)) if t is not None]
    parts += ray_tables(a)  # only where a job has Ray ops
    parts.append(processes_table(a))
    return Group(*parts)
