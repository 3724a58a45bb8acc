"""otel_sdk.py: each private name of the OpenTelemetry SDK and exporter taken away in turn
(its spelling in the module's tables changed, as a release that renamed it would leave it):
dpobs still counts every op exactly, and only the native family may go, said in the log and in
dpobs_instrumentation_errors_total{component="otel_sdk"}."""
from __future__ import annotations

import logging
import urllib.request

import pytest
import torch
from helpers import scrape, value
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel import names
from dpobs_otel.shims import otel_sdk
from dpobs_otel.exporters import protobuf

# Without these the op duration has no native buckets; without the others, a slower path.
NATIVE_NEEDS = {"histogram_aggregation", "create_aggregation", "empty_buckets",
                "sample_exemplar", "receive_metrics", *otel_sdk.AGGREGATION_FIELDS}
CASES = ([("NAMES", r) for r in otel_sdk.NAMES] + [("OWNED", r) for r in otel_sdk.OWNED]
         + [("AGGREGATION_FIELDS", f) for f in otel_sdk.AGGREGATION_FIELDS])
ROWS, ROUNDS = 4, 5


@pytest.fixture
def gone(monkeypatch):
    """Takes one name away: its spelling in otel_sdk's tables made one no SDK has."""
    def take(table: str, role: str) -> None:
        if table == "NAMES":
            monkeypatch.setitem(otel_sdk.NAMES, role, "_dpobs_renamed")
        elif table == "OWNED":
            module, _ = otel_sdk.OWNED[role]
            monkeypatch.setitem(otel_sdk.OWNED, role, (module, "_dpobs_renamed"))
        else:
            monkeypatch.setattr(otel_sdk, "AGGREGATION_FIELDS", tuple(
                "_dpobs_renamed" if f == role else f for f in otel_sdk.AGGREGATION_FIELDS))
        otel_sdk.reset()
    yield take
    monkeypatch.undo()
    otel_sdk.reset()


def _workload(tel) -> dict[str, int]:
    """ROUNDS rounds of put, get, list and clear of ROWS rows; the bytes each direction
    moved, computed here from the tensors."""
    store = dpobs.InMemoryDataPlane()
    store.register_partition("p")
    client = tel.instrument(store)
    written = read = 0
    for i in range(ROUNDS):
        ids = [f"r{i}-{k}" for k in range(ROWS)]
        td = TensorDict({"x": torch.arange(ROWS * 3, dtype=torch.float32).reshape(ROWS, 3)},
                        [ROWS])
        client.put_samples(ids, "p", td)
        written += td["x"].nbytes
        read += client.get_samples(ids, "p")["x"].nbytes
        client.list_sample_ids("p")
        client.clear_samples(ids, "p")
    return {"write": written, "read": read}


def _native_families(tel) -> bytes:
    request = urllib.request.Request(f"http://{tel.endpoint}/metrics",
                                     headers={"Accept": protobuf.CONTENT_TYPE})
    with urllib.request.urlopen(request, timeout=10) as r:
        return r.read()


def _counts_are_exact(tel, moved: dict[str, int]) -> None:
    m = scrape(tel)
    for op in ("put", "get", "list", "clear"):
        assert value(m, names.OP_DURATION_SERIES + "_count", op=op) == ROUNDS, op
    assert value(m, names.TRANSFERRED_SERIES, op="put", direction="write") == moved["write"]
    assert value(m, names.TRANSFERRED_SERIES, op="get", direction="read") == moved["read"]
    assert value(m, names.KEYS_SERIES, op="put") == ROUNDS * ROWS
    assert value(m, names.OUTSTANDING_KEYS_SERIES) == 0
    assert value(m, names.ROW_AGE_SERIES + "_count", op="get") == ROUNDS * ROWS


@pytest.mark.parametrize("table,role", CASES, ids=[f"{t}.{r}" for t, r in CASES])
def test_each_private_name_taken_away_leaves_every_count_exact(gone, caplog, table, role):
    gone(table, role)
    with caplog.at_level(logging.WARNING, logger="dpobs_otel"):
        tel = dpobs.start(role="sdk", rank=0, port=0, row_age=True)
        try:
            moved = _workload(tel)
            _counts_are_exact(tel, moved)
            native = names.OP_DURATION_NATIVE_SERIES.encode() in _native_families(tel)
            errors = value(scrape(tel), names.INSTR_ERRORS_SERIES,
                           component=names.OTEL_SDK_COMPONENT)
        finally:
            tel.shutdown()
    if role in NATIVE_NEEDS:
        assert not native, "a native family without the aggregation it needs"
        assert errors and errors >= 1
        assert any("native op-duration histogram" in r.getMessage() for r in caplog.records)
    else:
        assert native
    fallbacks = [r for r in caplog.records if "falls back" in r.getMessage()]
    assert len({r.getMessage() for r in fallbacks}) == len(fallbacks)  # each said once


def test_nothing_falls_back_on_the_sdk_the_suite_runs(caplog):
    otel_sdk.reset()
    with caplog.at_level(logging.WARNING, logger="dpobs_otel"):
        tel = dpobs.start(role="sdk", rank=0, port=0, row_age=True)
        try:
            _counts_are_exact(tel, _workload(tel))
            assert names.OP_DURATION_NATIVE_SERIES.encode() in _native_families(tel)
        finally:
            tel.shutdown()
    if otel_sdk.degradations():  # the floor's SDK (1.38) has no bound path: said, no more
        assert set(otel_sdk.degradations()) <= {"the op duration's bound record",
                                                    "the row-age bulk add",
                                                    "the reader's own registry"}


def test_a_histogram_that_raises_costs_the_op_nothing_else(monkeypatch):
    tel = dpobs.start(role="sdk", rank=0, port=0, row_age=True)
    try:
        def broken(*args, **kwargs):
            raise RuntimeError("histogram down")
        for record in tel.op_records.values():
            record._adds = ()  # unbound: every value takes record(), which now raises
        monkeypatch.setattr(tel.op_duration, "record", broken)
        moved = _workload(tel)
        m = scrape(tel)
        assert value(m, names.TRANSFERRED_SERIES, op="put", direction="write") == moved["write"]
        assert value(m, names.KEYS_SERIES, op="get") == ROUNDS * ROWS
        assert value(m, names.INSTR_ERRORS_SERIES, component="histogram") == 4 * ROUNDS
    finally:
        tel.shutdown()


def test_an_exporter_without_registry_keeps_each_process_on_its_own(monkeypatch):
    from prometheus_client import REGISTRY, CollectorRegistry

    from dpobs_otel.exporters.native_histograms import NativeReader

    class Old(NativeReader):
        def __init__(self):
            try:  # what an old exporter does with no argument
                super().__init__(registry=REGISTRY)
            except TypeError:  # an old exporter (the floor's)
                super().__init__()

    otel_sdk.reset()
    mine = CollectorRegistry()
    reader, serving = otel_sdk.prometheus_reader(Old, mine)
    assert serving is not REGISTRY
    collector = getattr(reader, otel_sdk.NAMES["collector"])
    assert collector in serving._collector_to_names
    assert collector not in REGISTRY._collector_to_names
    assert "the reader's own registry" in otel_sdk.degradations()
    # Shut down: gone from its own registry, never put in the global one, where another
    # reader's collector of the same names may stand (the floor cell failed on that); twice
    # is harmless.
    other = Old()  # an old exporter's reader left in the global registry
    try:
        reader.shutdown()
        reader.shutdown()
    finally:
        REGISTRY.unregister(getattr(other, otel_sdk.NAMES["collector"]))
    assert collector not in serving._collector_to_names
    assert collector not in REGISTRY._collector_to_names
    otel_sdk.reset()
