"""Every kv_* entry point of the installed TransferQueue measured, refusals included, and
the rows a read drops: always counted, logged at most once per partition per minute.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging

import pytest
import torch
import transfer_queue as tq
from helpers import scrape, value
from tensordict import TensorDict
from helpers.transferqueue import LIST_REFUSES, MISSING, OPS, SHORT_READS, T

from dpobs_otel.testing.transferqueue import call

import dpobs_otel.adapters.transferqueue as dtq
from dpobs_otel.adapters.transferqueue import kv


# -- every kv_* entry point of the installed TransferQueue, failures included -----------
KV_ENTRY_POINTS = sorted(n for n in dir(tq) if n.startswith(("kv_", "async_kv_")))
OP_OF = {"kv_put": "put", "kv_batch_put": "put", "kv_batch_get": "get",
         "kv_batch_get_by_meta": "get", "kv_list": "list", "kv_clear": "clear"}


def test_adapter_defines_every_kv_entry_point():
    # Enumerated from the installed module: a kv_* function added upstream fails this test
    # instead of passing through unmeasured.
    assert len(KV_ENTRY_POINTS) == 12, KV_ENTRY_POINTS
    assert {n.removeprefix("async_") for n in KV_ENTRY_POINTS} == set(OP_OF)
    assert [n for n in KV_ENTRY_POINTS if n not in vars(dtq.InstrumentedTransferQueue)] == []


def _calls(pid: str, meta) -> dict:
    """entry point (sync name) -> (a call TransferQueue serves, calls it refuses)."""
    td3 = TensorDict({"x": torch.arange(6).reshape(3, 2)}, batch_size=[3])
    ids = list(meta.keys)
    return {
        "kv_put": (("g", pid, {"x": torch.tensor([1, 2])}), [("g", pid, [1])]),
        "kv_batch_put": ((["g0", "g1", "g2"], pid, td3), [(["g0"], pid, td3)]),
        "kv_batch_get": ((ids, pid), [(["nobody"], pid)]),
        "kv_batch_get_by_meta": ((meta,), [(dataclasses.replace(meta, partition_id=None),),
                                          (meta, ["not_in_meta"])]),
        "kv_list": ((pid,), [(["not", "a", "partition"],)] if LIST_REFUSES else []),
        "kv_clear": ((ids, pid), [(None, pid)]),
    }


def _refusal(fn, args):
    with pytest.raises(Exception) as info:
        call(fn, *args, timeout_s=T)
    return type(info.value), str(info.value)


@pytest.mark.parametrize("name", KV_ENTRY_POINTS)
def test_every_kv_entry_point_timed_and_counted_including_failures(cluster, make_tel, name):
    tel = make_tel(True)
    q = dtq.instrument(tel)
    pid = f"entry-{name}"
    sync = name.removeprefix("async_")
    meta = call(tq.kv_batch_put, keys=["m0", "m1"], partition_id=pid, timeout_s=T,
                fields=TensorDict({"x": torch.tensor([[1, 1], [2, 2]])}, batch_size=[2]))
    good, bad = _calls(pid, meta)[sync]

    fn = getattr(q, name)

    def invoke(*args):
        out = fn(*args)
        return asyncio.run(out) if name.startswith("async_") else out

    call(invoke, *good, timeout_s=T)
    expected = []
    for args in bad:
        want = _refusal(getattr(tq, sync), args)  # what bare TransferQueue raises
        assert _refusal(invoke, args) == want  # the same exception, unchanged
        expected.append(want[0].__name__)
    s = scrape(tel)
    op = OP_OF[sync]
    assert value(s, OPS, op=op) == 1 + len(bad)  # failures are timed too
    for error_type in set(expected):
        assert value(s, "dpobs_client_operation_errors_total", op=op,
                     error_type=error_type) == expected.count(error_type)
    assert sum(v for (n, _), v in s.items() if n == "dpobs_client_operation_errors_total") \
        == len(bad)
    call(tq.kv_clear, ["m0", "m1", "g", "g0", "g1", "g2"], pid, timeout_s=T)


# -- rows TransferQueue drops from a read: counted always, logged once a minute --------
def test_dropped_rows_logged_once_per_partition_per_minute(cluster, make_tel, caplog,
                                                           monkeypatch):
    if not SHORT_READS:
        pytest.skip("TransferQueue before 0.1.9 drops no rows: an absent key fails the read "
                    "(test_transferqueue.py's short-read test checks that)")
    tel = make_tel(False)
    q = dtq.instrument(tel)
    now = [1000.0]
    monkeypatch.setattr(kv, "_clock", lambda: now[0])
    td = TensorDict({"x": torch.tensor([[1, 1], [2, 2]])}, batch_size=[2])
    for pid in ("drop1", "drop2"):
        call(q.kv_batch_put, ["a", "b"], pid, td, timeout_s=T)

    def lines(pid):
        return [r.getMessage() for r in caplog.records
                if r.name == "dpobs_otel.adapters.transferqueue" and f"partition {pid!r}" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="dpobs_otel.adapters.transferqueue"):
        for i in range(3):
            got = call(q.kv_batch_get, ["a", f"ghost{i}", "b"], "drop1", timeout_s=T)
            assert got.batch_size[0] == 2
        call(q.kv_batch_get, ["ghost", "ghost'", "a"], "drop2", timeout_s=T)
        assert len(lines("drop1")) == 1 and "missing: ghost0" in lines("drop1")[0]
        assert len(lines("drop2")) == 1
        now[0] += 59.0
        call(q.kv_batch_get, ["a", "ghost3", "b"], "drop1", timeout_s=T)
        assert len(lines("drop1")) == 1
        now[0] += 2.0  # a minute after the first line
        call(q.kv_batch_get, ["ghost4", "b"], "drop1", timeout_s=T)
        assert len(lines("drop1")) == 2
        # The line after a quiet minute says what it did not log.
        assert "missing: ghost4" in lines("drop1")[1]
        assert "3 earlier short reads (3 rows) not logged" in lines("drop1")[1]
    s = scrape(tel)
    assert value(s, MISSING, op="get") == 3 + 2 + 1 + 1  # every dropped row, logged or not
    for pid in ("drop1", "drop2"):
        call(tq.kv_clear, ["a", "b"], pid, timeout_s=T)
