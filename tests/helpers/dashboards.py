"""The shipped dashboards' queries as Grafana sends them, for the live tests that ask a real
Prometheus for each (tests/test_e2e.py; the store's row in tests/demo/test_store_metrics.py,
the one run with a store exporter scraped; the Ray rows in
tests/adapters/ray/test_ray_store_alerts.py, against a live Ray)."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A query of the store's own account: it has data only where a store exporter is scraped.
STORE = re.compile(r"dpobs_store_|\btq_")
# The rows of Ray's own account: they have data only where a Ray job is scraped.
RAY_ROW = re.compile(r"^Ray\b")
# Grafana's "All" for every variable.
ALL = {"job": ".*", "node": ".*", "role": ".*", "instance": ".*"}


def dashboard_exprs(rows=None):
    """(dashboard / panel title, expr) of every target of every shipped dashboard; with
    `rows` (a pattern), only those of the panels under a row whose title it matches."""
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        dash = json.loads(path.read_text())
        under = None  # the title of the row the panels that follow sit under
        for panel in dash["panels"]:
            if panel["type"] == "row":
                under = panel["title"]
            if rows is not None and not (under and rows.search(under)):
                continue
            for p in panel.get("panels", []) if panel["type"] == "row" else [panel]:
                for t in p.get("targets", []):
                    yield f"{path.stem} / {p['title']}", t["expr"]


def ray_row_exprs():
    """dashboard_exprs() of the Ray rows alone."""
    return dashboard_exprs(RAY_ROW)


def substitute(expr: str, values: dict[str, str]) -> str:
    """What Grafana sends: $__rate_interval at 1m (>= 4 scrapes), variables by value."""
    expr = expr.replace("$__rate_interval", "1m")
    expr = re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)
    assert "$" not in expr, expr
    return expr
