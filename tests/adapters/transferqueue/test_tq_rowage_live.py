"""Row age on a live TransferQueue (local Ray): ages from a clock the test moves, guard on and
off, stamped and unstamped rows in one read, a delta write restamping, and nothing of the
stamp in what the caller gets back (data, KVBatchMeta, kv_list) or in the bytes counted."""
from __future__ import annotations

import pytest
import torch
from helpers import scrape
from helpers.rowage import check_live_reads, telemetries
from helpers.transferqueue import T
from tensordict import TensorDict

import dpobs_otel.adapters.transferqueue as dtq
from dpobs_otel import rowage
from dpobs_otel.testing.transferqueue import call


def batch(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"tok": torch.randint(0, 9, (n, 6), generator=g),
                       "adv": torch.randn(n, generator=g)}, batch_size=[n])


@pytest.mark.parametrize("guard", [False, True], ids=["plain", "guard"])
def test_row_age_on_transferqueue(cluster, monkeypatch, guard):
    now = [1_700_000_000 * 10**9]
    monkeypatch.setattr(rowage, "_clock", lambda: now[0])
    with telemetries() as make:
        writer, plain, reader = make(True, guard), make(False, guard), make(True, guard)
        qw, qp, qr = dtq.instrument(writer), dtq.instrument(plain), dtq.instrument(reader)
        pid = f"age-{guard}"
        meta = call(qw.kv_batch_put, ["a0", "a1", "a2"], pid, batch(3),
                    [{"u": i} for i in range(3)], timeout_s=T)
        call(qp.kv_batch_put, ["b0", "b1"], pid, batch(2, 1), timeout_s=T)
        now[0] += 4 * 10**9
        call(qw.kv_batch_put, ["a2"], pid, TensorDict({"extra": torch.ones(1)}, [1]),
             timeout_s=T)
        now[0] += 10**9
        got = call(qr.kv_batch_get, ["a0", "b0", "a1", "b1", "a2"], pid, ["tok"], timeout_s=T)
        full = call(qr.kv_batch_get, ["a0", "a1"], pid, timeout_s=T)
        listed = call(qr.kv_list, pid, timeout_s=T)
        m = scrape(reader)
    assert sorted(meta.fields) == ["adv", "tok"]
    assert list(meta.tags) == [{"u": 0}, {"u": 1}, {"u": 2}]
    assert listed[pid]["a0"] == {"u": 0} and listed[pid]["b0"] == {}
    check_live_reads(m, got, full, guard)
