"""`dpobs demo --async K --row-age` end to end (real processes, the in-memory store): a slow
rollout, a slow trainer and a balanced run each get their verdict, and the row age the
trainers' histograms hold lies within the bounds the workload's own wall clock gives."""
from __future__ import annotations

import pytest

from dpobs_otel.demo import report as demo
from dpobs_otel.demo.batches import Config
from dpobs_otel.demo.queue import metric_row_age, queue, queue_lines, row_age_truth
from dpobs_otel.readback.verdict import verdict

# In the serial pass (Makefile): the verdicts weigh the producers' pace against the consumers',
# and beside three other workers the balanced run read "consumer-bound" once (its rows aged
# 1.01 consumer steps, against 1.0).
pytestmark = pytest.mark.alone


@pytest.mark.slow
@pytest.mark.parametrize("rollout_ms, train_ms, k, want", [
    (100, 0, 3, "producer-bound"),  # trainers wait on an empty store
    (0, 100, 3, "consumer-bound"),  # rows sit up to K steps while trainers never wait
    (50, 50, 1, "neither"),  # one step ahead at most, neither side idles much
], ids=["slow-rollout", "slow-trainer", "balanced"])
def test_async_demo_tells_who_waits_for_whom(monkeypatch, rollout_ms, train_ms, k, want):
    for var in [v for v in __import__("os").environ if v.startswith("DPOBS_")]:
        monkeypatch.delenv(var)
    cfg = Config(steps=12, trainers=2, batch_size=8, min_len=8, max_len=32, latency_s=0.001,
                 async_k=k, row_age=True, rollout_ms=rollout_ms, train_ms=train_ms,
                 job=f"async-{want}")
    with demo.session(cfg) as res:
        q = queue(res)
        lines = queue_lines(res, cfg)
        trainers = [key for key in res.info if key[0] == "trainer"]
        mean, _, _, rows = metric_row_age([s for key in trainers for s in res.scraped[key]])
        lo, hi, true_rows = row_age_truth(res, trainers)
    assert verdict(q).startswith(want), (verdict(q), q)
    assert lines[0] == "\nWho waits for whom: " + verdict(q)
    # every read row observed once, its age between read start - put end and read end - put
    # start on the workload's clock (13 steps with the warm-up, two passes a trainer)
    assert rows == true_rows == 13 * cfg.batch_size * 2
    assert lo <= mean <= hi, (lo, mean, hi)
    if want == "consumer-bound":
        assert q.age_steps >= 1.0
    else:
        assert q.age_steps < 1.0
