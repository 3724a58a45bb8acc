"""The cluster view's row_age keys against the truth of a clock the test moves: rows and
their mean age over every process that read in the window, differenced between calls, and
no maximum (it cannot be differenced from counters)."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel import rowage
from dpobs_otel.readback.cluster import ClusterView

JOB = "dpobs-age"
P = "dpobs/cluster/"


def test_cluster_row_age_sums_the_readers_windows(sd, monkeypatch):
    now = [1_700_000_000 * 10**9]
    monkeypatch.setattr(rowage, "_clock", lambda: now[0])
    tels = [dpobs.start(role=r, rank=i, job=JOB, port=0, sd_dir=str(sd), row_age=True)
            for i, r in enumerate(("rollout", "trainer", "trainer"))]
    try:
        store = dpobs.InMemoryDataPlane()
        writer, r1, r2 = (t.instrument(store) for t in tels)
        view = ClusterView(str(sd), JOB)
        first = view.step_metrics()
        assert P + "row_age/rows" not in first  # no process has aged a row yet
        writer.put_samples(["a", "b", "c"], "p",
                           TensorDict({"x": torch.zeros(3, 2)}, [3]))
        now[0] += 2 * 10**9
        r1.get_samples(["a", "b"], "p")  # 2 rows aged 2 s
        now[0] += 10**9
        r2.get_samples(["a", "b", "c"], "p", ["x"])  # 3 rows aged 3 s
        got = view.step_metrics()
        assert got[P + "row_age/rows"] == 5
        assert got[P + "row_age/mean_s"] == pytest.approx((2 * 2 + 3 * 3) / 5)
        assert not any("row_age/max" in k for k in got)
        now[0] += 10**9
        r1.get_samples(["c"], "p")  # the next window: only this row, aged 4 s
        again = view.step_metrics()
        assert again[P + "row_age/rows"] == 1
        assert again[P + "row_age/mean_s"] == pytest.approx(4.0)
        idle = view.step_metrics()
        assert P + "row_age/rows" not in idle and P + "row_age/mean_s" not in idle
    finally:
        for t in tels:
            t.shutdown()
