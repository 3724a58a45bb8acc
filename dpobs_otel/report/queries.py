"""The overview dashboard's panel queries, taken from the built dashboard itself so the report
never retypes one: a panel's title -> its PromQL expressions, with the dashboard's variables
filled in for one job and the whole time range."""
from __future__ import annotations

import json
import re

RATE_INTERVAL = "5m"  # the recording rules' window: every other number is over 5m too


def fill(expr: str, job: str) -> str:
    """A dashboard query for one job: `$job` is that job (regex-quoted), every other
    variable matches anything, `$__rate_interval` is the rules' window."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    expr = expr.replace('=~"$job"', '=~"' + re.escape(job).replace("\\", "\\\\") + '"')
    return re.sub(r'=~"\$\w+"', '=~".*"', expr)


def overview_queries(job: str) -> dict[str, list[str]]:
    """Each overview panel's title (a repeated panel's without its `: $job`) -> its
    queries in order, filled for `job`."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    from ..mixin.config import DEFAULT
    from ..mixin.dashboards import overview
    built = json.loads(json.dumps(overview(DEFAULT).build(), cls=JSONEncoder))
    out = {}
    for panel in built.get("panels", []):
        title = panel.get("title", "").removesuffix(": $job")
        exprs = [t["expr"] for t in panel.get("targets", []) if "expr" in t]
        if exprs:
            out[title] = [fill(e, job) for e in exprs]
    return out


def _who(m: dict) -> str:
    return f"{m.get('role', '?')} {m.get('rank', '?')}"


def from_prometheus(prom, job: str) -> dict:
    """The panels' bars from the overview's queries (and the report's step rate) for `job`."""
    from .answers import BYTES, FRAC, GUARD, LATENCY, MB, SHARE, WEIGHTS, _put, step_rate
    q = overview_queries(job)
    found: dict = {}

    def each(title: str, index: int = 0):
        return [(r["metric"], r["value"]) for r in prom.query(q[title][index])]

    for m, v in each("Processes by data-plane fraction of step"):
        _put(found, FRAC, "data plane (op-seconds)", _who(m), 100 * v)
    for m, v in each("Processes by exposed fraction of step"):
        _put(found, FRAC, "exposed", _who(m), 100 * v)
    for m, v in each("Share of data-plane time by op"):
        _put(found, SHARE, "share", m.get("op", "?"), 100 * v)
    native, classic, mean = (each("Latency by op: p50, p90, p99 and mean", i) for i in range(3))
    for m, v in (native or classic) + [({**m, "quantile": "mean"}, v) for m, v in mean]:
        label = m["quantile"] if m["quantile"] == "mean" else f"p{float(m['quantile']) * 100:g}"
        _put(found, LATENCY, label, m.get("op", "?"), 1000 * v)
    rate = prom.query(step_rate(job))
    if rate and rate[0]["value"] > 0:
        for m, v in each("Bytes per second by op and direction"):
            _put(found, BYTES, m.get("direction", "?"), m.get("op", "?"),
                 v / rate[0]["value"] / MB)
    for m, v in each("Weight sync time: mean per side and the slowest receiver"):
        _put(found, WEIGHTS, "mean", m.get("side", "?"), 1000 * v)
    for title, label in (("Guard: rows checked (5m)", "checked"),
                         ("Guard: rows mismatched (5m)", "mismatched"),
                         ("Guard: rows unverified", "unverified")):
        for _, v in each(title):
            _put(found, GUARD, "rows", label, v)
    return found
