"""The page as data: each panel a title, its axes' labels (units in parentheses) and labelled
bars (series -> category -> value), from the overview's queries against Prometheus or from
the cluster view of a file_sd directory. A panel with nothing to show (no value, or only
zeros) is left off the page and named in its caption, never drawn empty."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import names as n

FRAC = "Fraction of step per process"
SHARE = "Share of data-plane time by op"
LATENCY = "Latency by op"
BYTES = "Bytes per step by op and direction"
WEIGHTS = "Weight sync time per side"
GUARD = "Wire guard: rows"
ORDER = (FRAC, SHARE, LATENCY, BYTES, WEIGHTS, GUARD)
AXES = {  # title -> (x label, y label with its unit)
    FRAC: ("process (role rank)", "fraction of step (%)"),
    SHARE: ("op", "share of data-plane time (%)"),
    LATENCY: ("op", "latency (ms)"),
    BYTES: ("op", "payload per step (MB)"),
    WEIGHTS: ("side", "mean time per sync (ms)"),
    GUARD: ("rows", "rows (count)"),
}
MB = 1e6


@dataclass
class Panel:
    title: str
    bars: dict[str, dict[str, float]]  # series -> category -> value

    @property
    def axes(self) -> tuple[str, str]:
        return AXES[self.title]


@dataclass
class Page:
    title: str
    caption: str
    panels: list[Panel] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    verdict: str = ""  # the job's one line (readback/headline.py), under the title


def page(title: str, source: str, found: dict[str, dict[str, dict[str, float]]],
         verdict: str = "") -> Page:
    """The panels in ORDER; those without a single non-zero value (an axis around nothing)
    named as missing in the caption."""
    out = Page(title, source, verdict=verdict)
    for name in ORDER:
        bars = {s: c for s, c in found.get(name, {}).items() if c}
        if any(v for c in bars.values() for v in c.values() if math.isfinite(v)):
            out.panels.append(Panel(name, bars))
        else:
            out.missing.append(name)
    if out.missing:
        out.caption += ". No data, not drawn: " + ", ".join(out.missing)
    return out


def _put(found: dict, panel: str, series: str, category: str, value: float) -> None:
    cats = found.setdefault(panel, {}).setdefault(series, {})
    cats[category] = cats.get(category, 0.0) + value


def from_window(w, table) -> dict:
    """The panels' bars from one cluster-view window (readback/cluster.py's Window) and its
    breakdown (columns, rows)."""
    found: dict = {}
    procs = list(w.deltas.values())
    stepping = [d.steps for _, d in procs if d.steps > 0]
    steps = sum(stepping) / len(stepping) if stepping else 0.0  # a stepping process's mean
    weights: dict[str, list[float]] = {}
    for labels, d in procs:
        who = f"{labels.get('role', '?')} {labels.get('rank', '?')}"
        if d.step_seconds > 0:
            op_s = sum(o.seconds for o in d.ops.values())
            _put(found, FRAC, "data plane (op-seconds)", who, 100 * op_s / d.step_seconds)
            _put(found, FRAC, "exposed", who, 100 * d.exposed_seconds / d.step_seconds)
        for op, o in d.ops.items():
            for direction, nbytes in (("read", o.read_bytes), ("write", o.write_bytes)):
                if nbytes and steps:
                    _put(found, BYTES, direction, op, nbytes / steps / MB)
        for side, s in (d.weights.sides.items() if d.weights else ()):
            acc = weights.setdefault(side, [0.0, 0.0])
            acc[0], acc[1] = acc[0] + s.seconds, acc[1] + s.syncs
        for key in ("rows_checked", "rows_mismatched", "rows_unverified"):
            if d.guard is not None and key in d.guard:
                _put(found, GUARD, "rows", key.removeprefix("rows_"), d.guard[key])
    for side, (seconds, syncs) in weights.items():
        if syncs:
            _put(found, WEIGHTS, "mean", side, 1000 * seconds / syncs)
    _from_breakdown(found, table)
    return found


def _from_breakdown(found: dict, table) -> None:
    columns, rows = table
    for row in rows:
        r = dict(zip(columns, row))
        if not r["calls"]:
            continue
        _put(found, SHARE, "share", r["op"], 100 * r["share"])
        for q in ("mean_ms", "p50_ms", "p90_ms", "p99_ms"):
            if r.get(q) is not None:
                _put(found, LATENCY, q.removesuffix("_ms"), r["op"], r[q])


def step_rate(job: str) -> str:
    """Steps per second of the job's mean stepping process (one without steps has no step
    series), to turn the overview's bytes per second into bytes per step (the overview has
    no per-step panel)."""
    return (f'avg(sum by (node, instance) (rate({n.STEP_DURATION_SERIES}_count{{job="{job}"}}'
            f'[5m])))')
