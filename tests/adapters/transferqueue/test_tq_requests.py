"""requests.COVERAGE and requests.billed(), the recording rules' view of TABLE
(mixin/store_rules.py), held to TABLE itself: coverage counts each op once only if every
form of it makes exactly one of its requests and no other op's plain form makes any; the
server seconds bill each op at least the requests of either API's plain form."""
from __future__ import annotations

import pytest

from dpobs_otel.adapters.transferqueue.requests import COVERAGE, TABLE, billed, requests

NEWEST = max(since for entries in TABLE.values() for since, _ in entries)
# Forms of a covered op that make none of its requests: nothing reaches the store (no key
# stored), or tags alone (no data): each makes coverage read high, never low.
MAKE_NONE = {"kv.put:tags", "kv.get:absent", "kv.clear:absent"}


def _op(call: str) -> str:
    return call.partition(".")[2].partition(":")[0]


def _signature(call: str, where: str, types) -> int:
    made = getattr(requests(call, NEWEST), where)
    return sum(made.get(t, 0) for t in types)


@pytest.mark.parametrize("covered", sorted(COVERAGE))
def test_each_form_of_a_covered_op_makes_exactly_one_of_its_requests(covered):
    ops, where, types = COVERAGE[covered]
    forms = [c for c in TABLE if _op(c) in ops]
    assert forms
    for call in forms:
        assert _signature(call, where, types) == (0 if call in MAKE_NONE else 1), call


@pytest.mark.parametrize("covered", sorted(COVERAGE))
def test_no_other_ops_plain_form_makes_a_covered_ops_request(covered):
    ops, where, types = COVERAGE[covered]
    others = [c for c in TABLE if ":" not in c and _op(c) not in ops]
    assert others
    for call in others:
        assert _signature(call, where, types) == 0, call


def test_the_pooled_ops_do_not_overlap():
    pooled = [op for ops, _, _ in COVERAGE.values() for op in ops]
    assert len(pooled) == len(set(pooled))


def test_billed_covers_either_apis_plain_form():
    bills = billed()
    for call in TABLE:
        if ":" in call or _op(call) not in bills:
            continue
        made, bill = requests(call, NEWEST), bills[_op(call)]
        assert set(made.controller) <= set(bill.controller), call
        assert set(made.storage) <= set(bill.storage), call
    assert set(bills["put"].controller) - set(requests("client.put", NEWEST).controller) == {
        "KV_RETRIEVE_META"}  # the one request a client put is billed and does not make
