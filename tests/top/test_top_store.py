"""`dpobs top`'s lines of the store's own account (issue 33): the server share and coverage per
op, and the job's coverage, from the recording rules; nothing where no job's store exporter is
scraped (the records then have no series)."""
from __future__ import annotations

import pytest

from dpobs_otel import names
from dpobs_otel.top import store
from helpers.top import Canned, number, table, text

TITLE = "The store's own account"



def per_op(job: str, **values: float) -> list[tuple[dict, float]]:
    return [({"job": job, "op": op}, v) for op, v in values.items()]


# Job tq (its controller scraped): a get's store seconds exceed its client's (two units
# serve it in parallel), a put's are a quarter of them; claim_meta is billed but covered by no
# request of its own; 8 of 10 reads per second come from measured clients. Job mem has no
# store: dpobs's own op records only, which the store's account never reads.
ANSWERS = {
    names.JOB_OP_STORE_SERVER_SHARE: per_op("tq", put=0.25, get=1.5, claim_meta=0.5),
    names.JOB_OP_STORE_MADE: per_op("tq", put=4.0, get=8.0, clear=2.0),
    names.JOB_OP_STORE_SERVED: per_op("tq", put=4.0, get=10.0, clear=2.0),
    names.JOB_OP_STORE_COVERAGE: per_op("tq", put=1.0, get=0.8, clear=1.0),
    names.JOB_STORE_COVERAGE: [({"job": "tq"}, 14 / 16)],
    names.JOB_OP_SHARE: per_op("mem", put=0.5, get=0.5) + per_op("tq", put=0.5, get=0.5),
}


def test_prometheus_source_reads_the_stores_account_per_op_and_job():
    a = Canned(ANSWERS).answers()
    assert not a.error
    got = [(s.job, s.op, s.server_share, s.client_share, s.made_per_s, s.served_per_s,
            s.coverage) for s in a.store]
    assert got == [
        ("tq", "claim_meta", 0.5, 0.5, None, None, None),
        ("tq", "clear", None, None, 2.0, 2.0, 1.0),
        ("tq", "get", 1.5, 0.0, 8.0, 10.0, 0.8),  # the client side clamped at 0
        ("tq", "put", 0.25, 0.75, 4.0, 4.0, 1.0),
        ("tq", store.ALL_OPS, None, None, None, None, 14 / 16),
    ]
    rows = {r["op"]: r for r in table(text(a), TITLE)}
    assert {r["job"] for r in rows.values()} == {"tq"}  # mem has no store scraped
    assert (rows["get"]["server share"], rows["get"]["client side"]) == ("150.0%", "0.0%")
    assert (number(rows["get"]["made/s"]), number(rows["get"]["served/s"])) == (8, 10)
    assert rows["get"]["coverage"] == "80.0%"
    assert rows[store.ALL_OPS]["coverage"] == "87.5%"
    assert (rows["clear"]["server share"], rows["claim_meta"]["coverage"]) == ("-", "-")


def test_no_store_scraped_no_lines_and_no_table():
    a = Canned({names.JOB_OP_SHARE: ANSWERS[names.JOB_OP_SHARE]}).answers()
    assert a.store == [] and TITLE not in text(a)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_value_that_is_no_number_is_no_answer(bad):
    """A ratio Prometheus could not form (0/0 is NaN) reads as '-', never as a number."""
    lines = store.from_prometheus(lambda expr: {
        names.JOB_OP_STORE_COVERAGE: per_op("tq", get=bad, put=1.0)}.get(expr, []))
    assert [(s.op, s.coverage) for s in lines] == [("put", 1.0)]
