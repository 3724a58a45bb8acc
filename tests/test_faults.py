"""Faults injected into each of dpobs's own components (issue 31, item 3).

On an op's way (sizing, occupancy, the guard's hooks, row age, tracing, the critical path,
the histogram's fast path, the reconciliation), each made to raise in turn: the user's
call returns what the store returned, the op is counted once with its duration, the
failure is one dpobs_instrumentation_errors_total{component} increment (names.py pins the
components) and one log line per component per process, and once the fault is gone the next
op is measured as usual. A fault while the store itself raised keeps the store's exception,
the same object. Off the op's way: a file_sd write that fails leaves the endpoint serving
(counted), an exporter callback that fails leaves the ops counted and the next scrape whole.
"""
from __future__ import annotations

import asyncio
import logging

import pytest
import torch
from helpers import scrape, value
from helpers.aplane import AsyncPlane
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel import client as client_mod
from dpobs_otel import names, telemetry
from dpobs_otel.shims.otel_histogram import BoundRecord
from dpobs_otel.critical import CriticalPath, _Watch
from dpobs_otel.account import Account
from dpobs_otel.occupancy import Occupancy

COUNT = "dpobs_client_operation_duration_seconds_count"
SUM = "dpobs_client_operation_duration_seconds_sum"
ERRORS = names.INSTR_ERRORS_SERIES
PART = "p"


def _guard(tel):
    return type(tel.guard)


def _row_age(tel):
    return type(tel.row_age)


def _tracer(tel):
    return type(tel.tracer)


# component -> (the op it lies on, where the fault goes: (owner of tel, attribute))
FAULTS = {
    "sizing/put": (names.COMPONENT_SIZING, "put", lambda tel: client_mod, "field_nbytes"),
    "sizing/get": (names.COMPONENT_SIZING, "get", lambda tel: client_mod, "payload_nbytes"),
    "occupancy/put": (names.COMPONENT_OCCUPANCY, "put", lambda tel: Occupancy, "add"),
    "occupancy/clear": (names.COMPONENT_OCCUPANCY, "clear", lambda tel: Occupancy, "release"),
    "guard/put": (names.COMPONENT_GUARD, "put", _guard, "before_put"),
    "guard/get": (names.COMPONENT_GUARD, "get", _guard, "after_get"),
    "row_age/put": (names.COMPONENT_ROW_AGE, "put", _row_age, "stamp"),
    "row_age/get": (names.COMPONENT_ROW_AGE, "get", _row_age, "observe"),
    "row_age/get-inside": (names.COMPONENT_ROW_AGE, "get", _row_age, "_count"),
    "trace/put": (names.COMPONENT_TRACE, "put", _tracer, "op"),
    "critical_path/start": (names.COMPONENT_CRITICAL_PATH, "get", lambda tel: CriticalPath,
                            "start"),
    "critical_path/end": (names.COMPONENT_CRITICAL_PATH, "put", lambda tel: CriticalPath,
                          "end"),
    "critical_path/awaited-before": (names.COMPONENT_CRITICAL_PATH, "async get",
                                     lambda tel: _Watch, "__init__"),
    "critical_path/awaited-after": (names.COMPONENT_CRITICAL_PATH, "async put",
                                    lambda tel: _Watch, "close"),
    "histogram/get": (names.COMPONENT_HISTOGRAM, "get", lambda tel: BoundRecord, "__call__"),
    "reconcile/put": (names.COMPONENT_RECONCILE, "put", lambda tel: Account, "reconcile"),
}


class Injected(Exception):
    """dpobs's own failure, made on purpose."""


def _raise(*args, **kwargs):
    raise Injected("injected")


@pytest.fixture
def tel(monkeypatch, tmp_path):
    for var in ("DPOBS_ROLE", "DPOBS_RANK", "DPOBS_PORT", "DPOBS_SD_DIR", "DPOBS_TRACE",
                "DPOBS_ROW_AGE", "DPOBS_VERIFY_TENSOR_HASH", "DPOBS_RECONCILE_ROWS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(telemetry, "_LOGGED", set())  # this test's process, fresh
    t = dpobs.start(role="test", rank=0, host="127.0.0.1", port=0, verify_tensor_hash=True,
                    row_age=True, trace=True, reconcile_rows=1)
    yield t
    t.shutdown()


def _rows(i: int) -> tuple[list[str], TensorDict]:
    ids = [f"r{i}-{k}" for k in range(3)]
    return ids, TensorDict({"x": torch.arange(6).reshape(3, 2) + 10 * i}, batch_size=[3])


def _op(client, op: str, i: int):
    """One `op` on rows of their own (a get reads rows put beforehand, a clear clears them);
    "async <op>": the same through a store whose methods are coroutine functions."""
    ids, td = _rows(i)
    if op.startswith("async "):
        return asyncio.run(_aop(client, op.removeprefix("async "), ids, td))
    if op == "put":
        return client.put_samples(ids, PART, td)
    if op == "get":
        return client.get_samples(ids, PART, ["x"])
    return client.clear_samples(ids, PART)


async def _aop(client, op, ids, td):
    if op == "put":
        return await client.put_samples(ids, PART, td)
    return await client.get_samples(ids, PART, ["x"])


def _client(tel, op: str):
    """(the instrumented client, the same kind of store bare) for `op`."""
    if op.startswith("async "):
        return tel.instrument(AsyncPlane(dpobs.InMemoryDataPlane())), AsyncPlane(
            dpobs.InMemoryDataPlane())
    return tel.instrument(dpobs.InMemoryDataPlane()), dpobs.InMemoryDataPlane()


def _prepare(store, op: str, n: int) -> None:
    """The rows a get or clear finds (through `store` itself: measured puts for a client)."""
    if op.endswith("get") or op == "clear":
        for i in range(n):
            _op(store, "async put" if op.startswith("async ") else "put", i)


def _same(got, want) -> bool:
    if isinstance(want, TensorDict):
        return set(got.keys()) == set(want.keys()) and all(
            torch.equal(got[k], want[k]) for k in want.keys())
    return got == want


def _name(op: str) -> str:
    return op.removeprefix("async ")


def _logged(caplog, component: str) -> int:
    return sum(f"internal error in {component}," in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("case", list(FAULTS))
def test_a_fault_on_the_ops_way_is_counted_and_harmless(tel, monkeypatch, caplog, case):
    component, op, owner, attribute = FAULTS[case]
    client, plain = _client(tel, op)
    _prepare(plain, op, 3)
    _prepare(client, op, 3)
    caplog.set_level(logging.WARNING, logger="dpobs_otel")
    monkeypatch.setattr(owner(tel), attribute, _raise)
    for i in range(2):  # the fault, twice: counted twice, logged once
        assert _same(_op(client, op, i), _op(plain, op, i))
        s = scrape(tel)
        assert value(s, COUNT, op=_name(op)) == i + 1 and value(s, SUM, op=_name(op)) > 0
        assert value(s, ERRORS, component=component) == i + 1
    assert _logged(caplog, component) == 1
    monkeypatch.undo()  # the fault gone: the next op measured as usual, nothing more counted
    assert _same(_op(client, op, 2), _op(plain, op, 2))
    s = scrape(tel)
    assert value(s, COUNT, op=_name(op)) == 3
    assert value(s, ERRORS, component=component) == 2
    assert tel.stats.ops[_name(op)].calls == 3 and tel.stats.ops[_name(op)].errors == 0


@pytest.mark.parametrize("case", list(FAULTS))
def test_a_fault_while_the_store_raised_keeps_the_stores_exception(tel, monkeypatch, case):
    component, op, owner, attribute = FAULTS[case]
    client, _ = _client(tel, op)
    _prepare(client, op, 1)
    err = ConnectionError("the store's own")

    def store_raises(*args, **kwargs):
        raise err

    method = {"put": "put_samples", "get": "get_samples", "clear": "clear_samples"}[_name(op)]
    inner = client.inner.plane if op.startswith("async ") else client.inner
    monkeypatch.setattr(inner, method, store_raises)
    monkeypatch.setattr(owner(tel), attribute, _raise)
    with pytest.raises(ConnectionError) as info:
        _op(client, op, 0)
    assert info.value is err
    monkeypatch.undo()
    s = scrape(tel)
    assert value(s, COUNT, op=_name(op)) == 1
    assert value(s, "dpobs_client_operation_errors_total", op=_name(op),
                 error_type="ConnectionError") == 1


def test_the_components_are_pinned_in_names():
    assert {c for c, *_ in FAULTS.values()} == set(names.OP_PATH_COMPONENTS)


def test_a_file_sd_write_that_fails_leaves_the_endpoint_serving(tmp_path, monkeypatch):
    monkeypatch.setattr(telemetry, "_LOGGED", set())
    (tmp_path / "file").write_text("")  # sd_dir below a file: no directory can be made there
    t = dpobs.start(role="test", rank=0, host="127.0.0.1", port=0,
                    sd_dir=str(tmp_path / "file" / "sd"))
    try:
        client = t.instrument(dpobs.InMemoryDataPlane())
        _op(client, "put", 0)
        s = scrape(t)
    finally:
        t.shutdown()
    assert value(s, ERRORS, component=names.COMPONENT_FILE_SD) == 1
    assert value(s, COUNT, op="put") == 1


def test_an_exporter_callback_that_fails_leaves_the_next_scrape_whole(tel, monkeypatch):
    client = tel.instrument(dpobs.InMemoryDataPlane())
    _op(client, "put", 0)
    whole = set(scrape(tel))
    monkeypatch.setattr(tel.stats, "outstanding", _raise)
    s = scrape(tel)
    assert value(s, COUNT, op="put") == 1  # the ops still counted
    assert not any(name.startswith("dpobs_client_outstanding") for name, _ in s)
    monkeypatch.undo()
    _op(client, "put", 1)
    s = scrape(tel)
    assert whole <= set(s)  # every series of before, the outstanding ones included
    assert value(s, COUNT, op="put") == 2
    assert value(s, ERRORS, component=names.COMPONENT_EXPORT) == 2  # two callbacks, once


def test_a_coroutine_store_is_not_reconciled_and_counts_no_error(tel, recwarn):
    # Its listing is a coroutine the put's thread cannot await: found by the async cases
    # above, where every put counted a reconcile error (and left a coroutine unawaited).
    client = tel.instrument(AsyncPlane(dpobs.InMemoryDataPlane()))
    for i in range(3):
        _op(client, "async put", i)
    assert tel.stats.instr_errors.get(names.COMPONENT_RECONCILE) is None
    assert not [w for w in recwarn if "never awaited" in str(w.message)]
