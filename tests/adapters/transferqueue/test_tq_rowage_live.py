"""Row age on a live TransferQueue (local Ray): ages from a clock the test moves, guard on and
off, stamped and unstamped rows in one read, a delta write restamping, and nothing of the
stamp in what the caller gets back (data, KVBatchMeta, kv_list) or in the bytes counted."""
from __future__ import annotations

import pytest
import torch
from helpers import scrape, value
from helpers.transferqueue import BYTES, T
from tensordict import TensorDict

import dpobs_otel as dpobs
import dpobs_otel.adapters.transferqueue as dtq
from dpobs_otel import rowage
from dpobs_otel.testing.transferqueue import call

AGE = "dpobs_client_row_age_seconds"


def batch(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"tok": torch.randint(0, 9, (n, 6), generator=g),
                       "adv": torch.randn(n, generator=g)}, batch_size=[n])


@pytest.fixture
def clock(monkeypatch):
    now = [1_700_000_000 * 10**9]
    monkeypatch.setattr(rowage, "_clock", lambda: now[0])
    return now


@pytest.fixture
def tels():
    made = []

    def make(row_age, guard):
        t = dpobs.start(role="test", rank=len(made), port=0, row_age=row_age,
                        verify_tensor_hash=guard)
        made.append(t)
        return t

    yield make
    for t in made:
        t.shutdown()


@pytest.mark.parametrize("guard", [False, True], ids=["plain", "guard"])
def test_row_age_on_transferqueue(cluster, tels, clock, guard):
    writer, plain, reader = tels(True, guard), tels(False, guard), tels(True, guard)
    qw, qp, qr = dtq.instrument(writer), dtq.instrument(plain), dtq.instrument(reader)
    pid = f"age-{guard}"
    meta = call(qw.kv_batch_put, ["a0", "a1", "a2"], pid, batch(3), [{"u": i} for i in range(3)],
                timeout_s=T)
    call(qp.kv_batch_put, ["b0", "b1"], pid, batch(2, 1), timeout_s=T)
    clock[0] += 4 * 10**9
    call(qw.kv_batch_put, ["a2"], pid, TensorDict({"extra": torch.ones(1)}, [1]), timeout_s=T)
    clock[0] += 10**9
    got = call(qr.kv_batch_get, ["a0", "b0", "a1", "b1", "a2"], pid, ["tok"], timeout_s=T)
    full = call(qr.kv_batch_get, ["a0", "a1"], pid, timeout_s=T)
    listed = call(qr.kv_list, pid, timeout_s=T)

    assert list(got.keys()) == ["tok"] and sorted(full.keys()) == ["adv", "tok"]
    assert sorted(meta.fields) == ["adv", "tok"] and [t for t in meta.tags] == [
        {"u": 0}, {"u": 1}, {"u": 2}]
    assert listed[pid]["a0"] == {"u": 0} and listed[pid]["b0"] == {}
    m = scrape(reader)
    # a0, a1 written 5 s before both reads; a2 restamped 1 s before; b0, b1 never stamped
    assert value(m, AGE + "_count", op="get") == 5
    assert value(m, AGE + "_sum", op="get") == pytest.approx(4 * 5 + 1)
    assert value(m, AGE + "_bucket", op="get", le="1.0") == 1
    assert value(m, AGE + "_bucket", op="get", le="5.0") == 5
    assert value(m, "dpobs_client_rows_unstamped_total", op="get", reason="no_stamp") == 2
    # the bytes read are the caller's tensors alone
    nbytes = got["tok"].nbytes + full["tok"].nbytes + full["adv"].nbytes
    assert value(m, BYTES, op="get", direction="read") == nbytes
    if guard:
        assert value(m, "dpobs_guard_rows_checked_total", field="tok") == 7
        assert value(m, "dpobs_guard_rows_mismatched_total", field="tok") == 0
