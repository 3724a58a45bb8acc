"""The shipped dashboards' queries as Grafana sends them, for the live tests that ask a real
Prometheus for each (tests/test_e2e.py; the store's row in tests/demo/test_store_metrics.py,
the one run with a store exporter scraped)."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A query of the store's own account: it has data only where a store exporter is scraped.
STORE = re.compile(r"dpobs_store_|\btq_")
# Grafana's "All" for every variable.
ALL = {"job": ".*", "node": ".*", "role": ".*", "instance": ".*"}


def dashboard_exprs():
    """(dashboard / panel title, expr) of every target of every shipped dashboard."""
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        dash = json.loads(path.read_text())
        for panel in dash["panels"]:
            for p in panel.get("panels", []) if panel["type"] == "row" else [panel]:
                for t in p.get("targets", []):
                    yield f"{path.stem} / {p['title']}", t["expr"]


def substitute(expr: str, values: dict[str, str]) -> str:
    """What Grafana sends: $__rate_interval at 1m (>= 4 scrapes), variables by value."""
    expr = expr.replace("$__rate_interval", "1m")
    expr = re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)
    assert "$" not in expr, expr
    return expr
