"""Row age on a live Mooncake: the stamp in each row's manifest (no key of its own), ages
from a clock the test moves, guard on and off, stamped and unstamped rows in one read, a
delta write restamping, and the stamp never in the caller's data or bytes."""
from __future__ import annotations

import pytest
import torch
from helpers import scrape, value
from helpers.mooncake import BYTES, master_keys
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel import rowage

AGE = "dpobs_client_row_age_seconds"


def batch(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"tok": torch.randint(0, 9, (n, 6), generator=g),
                       "adv": torch.randn(n, generator=g)}, batch_size=[n])


@pytest.mark.parametrize("guard", [False, True], ids=["plain", "guard"])
def test_row_age_on_mooncake(dp, master, monkeypatch, guard):
    now = [1_700_000_000 * 10**9]
    monkeypatch.setattr(rowage, "_clock", lambda: now[0])
    tels = [dpobs.start(role="test", rank=i, port=0, row_age=on, verify_tensor_hash=guard)
            for i, on in enumerate((True, False, True))]
    try:
        writer, plain, reader = (t.instrument(dp) for t in tels)
        writer.put_samples(["a0", "a1", "a2"], "p", batch(3))
        plain.put_samples(["b0", "b1"], "p", batch(2, 1))
        now[0] += 4 * 10**9
        writer.put_samples(["a2"], "p", TensorDict({"extra": torch.ones(1)}, [1]))
        now[0] += 10**9
        got = reader.get_samples(["a0", "b0", "a1", "b1", "a2"], "p", ["tok"])
        full = reader.get_samples(["a0", "a1"], "p")
        m = scrape(tels[2])
    finally:
        for t in tels:
            t.shutdown()
    assert not any("stamp" in k for k in master_keys(master))  # in the manifests only
    assert list(got.keys()) == ["tok"]
    assert sorted(full.keys()) == ["adv", "tok"]
    assert value(m, AGE + "_count", op="get") == 5
    assert value(m, AGE + "_sum", op="get") == pytest.approx(4 * 5 + 1)
    assert value(m, AGE + "_bucket", op="get", le="1.0") == 1
    assert value(m, "dpobs_client_rows_unstamped_total", op="get", reason="no_stamp") == 2
    nbytes = got["tok"].nbytes + full["tok"].nbytes + full["adv"].nbytes
    assert value(m, BYTES, op="get", direction="read") == nbytes
    if guard:
        assert value(m, "dpobs_guard_rows_checked_total", field="tok") == 7
        assert value(m, "dpobs_guard_rows_mismatched_total", field="tok") == 0
