"""`dpobs compare`'s rows of the store's own account (issue 33): read per job from the store's
records, printed per backend where they exist, and absent from the table where no backend's
store exporter was scraped. No Prometheus: canned answers stand in for the stack's."""
from __future__ import annotations

import re

from dpobs_otel import names
from dpobs_otel.demo import compare
from dpobs_otel.top.store import ALL_OPS


class Stack:
    """Answers stack.query(expr) as a Prometheus would, for the store's records only."""

    def __init__(self, series: dict[str, list[tuple[dict, float]]]):
        self.series = series

    def query(self, expr: str) -> list[dict]:
        return [{"metric": m, "value": v} for m, v in self.series.get(expr, [])]


def test_store_reads_the_jobs_server_share_and_coverage_only():
    stack = Stack({
        names.JOB_OP_STORE_SERVER_SHARE: [({"job": "dpobs-transferqueue", "op": "get"}, 0.375),
                                          ({"job": "other", "op": "get"}, 0.5)],
        names.JOB_OP_STORE_COVERAGE: [({"job": "dpobs-transferqueue", "op": "put"}, 1.0),
                                      ({"job": "dpobs-transferqueue", "op": "get"},
                                       float("nan"))],
        names.JOB_STORE_COVERAGE: [({"job": "dpobs-transferqueue"}, 0.75)],
    })
    assert compare._store(stack, "dpobs-transferqueue") == {
        ("server share", "get"): 0.375, ("coverage", "put"): 1.0, ("coverage", ALL_OPS): 0.75}
    assert compare._store(stack, "dpobs-memory") == {}


def result(store: dict | None) -> dict:
    one = {"ops": {}, "roles": {}, "frac": (0.5, 0.5), "own": 0.01, "guard": None,
           "quantiles": "native", "critical": {k: (0.25, None) for k in
                                              ("busy", "exposed", "most stalled")}}
    return one if store is None else dict(one, store=store)


def rows(text: str, heading: str) -> dict[str, list[str]]:
    """The op lines under `heading`, as op -> cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(heading))
    out = {}
    for line in lines[start + 1:]:
        if not line.startswith("    "):
            break
        label, *cells = re.split(r"\s{2,}", line.strip())
        out[label] = cells
    return out


def test_table_shows_the_account_beside_backends_without_one():
    text = compare.table({
        "memory": result(None),  # a result from before the store's account: no key at all
        "transferqueue": result({("server share", "get"): 0.375, ("server share", "put"): 1.5,
                                 ("coverage", "put"): 1.0, ("coverage", "get"): 0.8,
                                 ("coverage", ALL_OPS): 0.875}),
        "mooncake": result({})})
    assert rows(text, "server share") == {"get": ["-", "37.5%", "-"],
                                          "put": ["-", "150.0%", "-"]}
    cover = rows(text, "coverage")
    assert list(cover) == ["get", "put", ALL_OPS]  # the job's coverage last
    assert cover[ALL_OPS] == ["-", "87.5%", "-"]


def test_no_store_scraped_no_rows():
    text = compare.table({"memory": result({}), "mooncake": result(None)})
    assert "server share" not in text and "coverage" not in text
