"""Row age on a live Mooncake: the stamp in each row's manifest (no key of its own), ages
from a clock the test moves, guard on and off, stamped and unstamped rows in one read, a
delta write restamping, and the stamp never in the caller's data or bytes."""
from __future__ import annotations

import pytest
import torch
from helpers import scrape
from helpers.mooncake import master_keys
from helpers.rowage import check_live_reads, telemetries
from tensordict import TensorDict

from dpobs_otel import rowage


def batch(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"tok": torch.randint(0, 9, (n, 6), generator=g),
                       "adv": torch.randn(n, generator=g)}, batch_size=[n])


@pytest.mark.parametrize("guard", [False, True], ids=["plain", "guard"])
def test_row_age_on_mooncake(dp, master, monkeypatch, guard):
    now = [1_700_000_000 * 10**9]
    monkeypatch.setattr(rowage, "_clock", lambda: now[0])
    with telemetries() as make:
        tels = [make(on, guard) for on in (True, False, True)]
        writer, plain, reader = (t.instrument(dp) for t in tels)
        writer.put_samples(["a0", "a1", "a2"], "p", batch(3))
        plain.put_samples(["b0", "b1"], "p", batch(2, 1))
        now[0] += 4 * 10**9
        writer.put_samples(["a2"], "p", TensorDict({"extra": torch.ones(1)}, [1]))
        now[0] += 10**9
        got = reader.get_samples(["a0", "b0", "a1", "b1", "a2"], "p", ["tok"])
        full = reader.get_samples(["a0", "a1"], "p")
        m = scrape(tels[2])
    assert not any("stamp" in k for k in master_keys(master))  # in the manifests only
    check_live_reads(m, got, full, guard)
