"""The verdict's rules on hand-made numbers, and its numbers from hand-made samples."""
from __future__ import annotations

import pytest

from dpobs_otel import names
from dpobs_otel.mixin.config import Config
from dpobs_otel.readback.verdict import Queue, counts, from_processes, verdict


def test_the_three_verdicts_and_their_thresholds():
    c = Config()
    assert verdict(Queue(0.6, 0.1, 0.02), c).startswith("producer-bound")
    assert verdict(Queue(0.01, 0.1, 0.3), c).startswith("consumer-bound")
    assert verdict(Queue(0.1, 0.1, 0.05), c).startswith("neither")
    assert verdict(Queue(0.6, 0.1, 0.3), c).startswith("neither")  # both: no single side
    assert verdict(Queue(c.queue_wait_frac, 0.1, 0.1 * c.queue_age_steps), c).startswith(
        "neither")  # on both thresholds: waiting, and ageing
    assert verdict(Queue(0.3, 0.1, 0.05), Config(queue_wait_frac=0.5)).startswith("neither")
    assert verdict(Queue(0.01, 0.1, 0.15), Config(queue_age_steps=2.0)).startswith("neither")
    assert verdict(Queue()).startswith("neither: no consumer steps")
    assert "row age off" in verdict(Queue(0.01, 0.1, None))


def test_numbers_from_samples_by_role():
    def proc(step_s, steps, exposed, busy, age_s=0.0, aged=0, puts=0, outstanding=0):
        return counts([
            (names.STEP_DURATION_SERIES + "_sum", {}, step_s),
            (names.STEP_DURATION_SERIES + "_count", {}, steps),
            (names.STEP_EXPOSED_SERIES, {}, exposed), (names.STEP_BUSY_SERIES, {}, busy),
            (names.ROW_AGE_SERIES + "_sum", {"op": "get"}, age_s),
            (names.ROW_AGE_SERIES + "_count", {"op": "get"}, aged),
            (names.OP_DURATION_SERIES + "_count", {"op": "put"}, puts),
            (names.OP_DURATION_SERIES + "_count", {"op": "get"}, 99),
            (names.OUTSTANDING_KEYS_SERIES, {}, outstanding)])
    q = from_processes([("trainer", proc(10, 100, 6, 2, 3.0, 60)),
                        ("trainer", proc(10, 100, 1, 2, 1.0, 40)),  # exposed < busy: no wait
                        ("rollout", proc(10, 100, 0, 1, puts=100, outstanding=32)),
                        ("driver", proc(10, 100, 0, 1))])
    assert q.consumer_wait_frac == (6 - 2 + 0) / 20
    assert q.consumer_step_s == 20 / 200
    assert q.row_age_mean_s == 4.0 / 100
    assert q.producer_puts == 100 and q.outstanding_rows == 32
    assert q.age_steps == pytest.approx(0.4)
    other = from_processes([("learner", proc(10, 100, 6, 2, 3.0, 60))],
                           Config(consumer_roles="learner|trainer"))
    assert other.consumer_wait_frac == 0.4
