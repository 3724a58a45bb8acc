"""The hooks in a started Telemetry: ops of the sync and async clients, steps, and the waits
tel.waiting() and tel.exposed() count as exposed, each a span with its attributes; tracing
off leaves no tracer anywhere."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

import dpobs_otel as dpobs


@pytest.fixture
def traced(monkeypatch):
    for var in ("DPOBS_TRACE", "DPOBS_TRACE_EVERY", "DPOBS_NODE", "OTEL_TRACES_EXPORTER",
                "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    tel = dpobs.start(role="trainer", rank=2, port=0, trace=True)
    yield tel
    tel.shutdown()


def _spans(tel):
    return tel.tracer.snapshot()["spans"]


def test_sync_ops_steps_and_exposed_waits_are_spans(traced):
    tel = traced
    client = tel.instrument(dpobs.InMemoryDataPlane())
    client.register_partition("p")
    with tel.step():
        client.list_sample_ids("p")
        with tel.waiting():
            time.sleep(0.01)
        for _ in tel.exposed(iter([1, 2])):
            pass
        other = threading.Thread(target=lambda: tel.waiting().__enter__())
        other.start()  # another thread's wait is not the step's: no span
        other.join()
    got = [(s["name"], s["attributes"].get("wait"), s["attributes"].get("step"))
           for s in _spans(tel)]
    assert got == [("dpobs.register", None, None), ("dpobs.list", None, 1),
                   ("dpobs.wait", "waiting", 1), ("dpobs.wait", "exposed", 1),
                   ("dpobs.wait", "exposed", 1), ("dpobs.wait", "exposed", 1),
                   ("dpobs.step", None, 1)]
    wait = _spans(tel)[2]
    assert wait["end_ns"] - wait["start_ns"] >= 10_000_000
    assert tel.tracer.resource["role"] == "trainer" and tel.tracer.resource["rank"] == 2
    assert tel.tracer.resource["instance"].endswith(tel.endpoint.rsplit(":", 1)[1])


class AsyncStore:
    def __init__(self):
        self.inner = dpobs.InMemoryDataPlane()

    async def list_sample_ids(self, partition_id):
        await asyncio.sleep(0.005)
        return self.inner.list_sample_ids(partition_id)

    async def register_partition(self, partition_id):
        return self.inner.register_partition(partition_id)


def test_async_ops_are_spans_timed_to_the_awaited_result(traced):
    tel = traced
    client = tel.instrument(AsyncStore())

    async def main():
        await client.register_partition("p")
        with tel.step():
            await asyncio.gather(client.list_sample_ids("p"), client.list_sample_ids("p"))

    asyncio.run(main())
    lists = [s for s in _spans(tel) if s["name"] == "dpobs.list"]
    assert len(lists) == 2
    for s in lists:
        assert s["attributes"]["step"] == 1 and s["attributes"]["partition"] == "p"
        assert s["end_ns"] - s["start_ns"] >= 5_000_000


def test_an_error_is_a_span_with_its_type(traced):
    client = traced.instrument(dpobs.InMemoryDataPlane())
    with pytest.raises(KeyError):
        client.get_samples(["x"], "absent")
    (span,) = _spans(traced)
    assert span["name"] == "dpobs.get" and span["attributes"]["error.type"] == "KeyError"


def test_tracing_is_off_by_default_and_everywhere(monkeypatch):
    monkeypatch.delenv("DPOBS_TRACE", raising=False)
    tel = dpobs.start(role="t", rank=0, port=0)
    try:
        assert tel.tracer is None
        assert tel.instrument(dpobs.InMemoryDataPlane())._acct.tracer is None
    finally:
        tel.shutdown()
    monkeypatch.setenv("DPOBS_TRACE", "1")
    monkeypatch.setenv("DPOBS_NODE", "n7")
    tel = dpobs.start(role="t", rank=0, port=0)
    try:
        assert tel.tracer.resource["node"] == "n7"
    finally:
        tel.shutdown()


def test_mooncake_raw_store_ops_are_spans(traced):
    from dpobs_otel.adapters.mooncake import instrument_store
    from dpobs_otel.adapters.mooncake.store import RAW_PARTITION

    class Store:  # the one method used, answering as Mooncake's does (0: stored)
        def put(self, key, value):
            return 0

    with traced.step():
        assert instrument_store(traced, Store()).put("k", b"hello") == 0
    span = _spans(traced)[0]
    assert span["name"] == "dpobs.put" and span["attributes"]["keys"] == 1
    assert span["attributes"]["bytes"] == 5 and span["attributes"]["partition"] == RAW_PARTITION
