"""`dpobs compare` against real Prometheus: every cell's rule value beside the workload's truth."""
from __future__ import annotations

import math

import pytest

from dpobs_otel.demo import compare
from dpobs_otel.demo.backends import available
from dpobs_otel.demo.batches import Config
from dpobs_otel.testing.stack import Stack

# In the serial pass (Makefile, `alone`): each role's and op's share, read from Prometheus's
# rate() of two processes' series, is held against the workload's own clock within the
# extrapolation's slack, and beside three other workers the transferqueue trainer's share
# read 0.426 once (5cbaa0c's CI, the bound 0.4255); every serial run had passed.
pytestmark = [pytest.mark.slow, pytest.mark.alone]


@pytest.fixture(scope="module")
def results():
    names = ["memory"] + [b for b in ("mooncake", "transferqueue") if available(b) is None]
    out = {}
    with Stack(interval=compare.INTERVAL) as stack:
        for name in names:
            cfg = Config(steps=20, trainers=2, batch_size=16, latency_s=0.0, verify=True,
                         sd_dir=stack.sd_dir, backend=name, job=f"dpobs-{name}")
            out[name] = compare.measure(stack, cfg)
    return out


def test_every_backend_this_machine_has_is_compared(results):
    import os
    if os.environ.get("CI"):
        assert {"mooncake", "transferqueue"} <= set(results), "under CI every extra is installed"
    assert "memory" in results


def test_counts_and_volumes_equal_the_truth(results):
    for name, r in results.items():
        assert set(r["ops"]) == {"put", "get", "list", "clear"}, name  # register: warm-up only
        for op, cells in r["ops"].items():
            rules, truth = cells["calls"]
            assert rules == truth, (name, op)
            rules, truth = cells["bytes/call"]
            # Per-call bytes: the two rates of one query share each process's extrapolation
            # (compare._bytes_per_call), so what is left is how the trainers' rates weight their
            # own bytes per call, which differ: 4e-5 and 1.7e-3 seen on get. A rule read
            # between scrapes was 1/31 off.
            if truth:
                assert rules == pytest.approx(truth, rel=0.01), (name, op)
            else:
                assert math.isnan(rules), (name, op)


def _between(value, a, b, slack) -> bool:
    """The rules' window holds the measured steps and part of the warm-up step, so a ratio
    lies between the measured steps' truth and the truth with the whole warm-up."""
    return min(a, b) - slack <= value <= max(a, b) + slack


def _extrapolation(r) -> float:
    """How far rate() can move a ratio of two processes' rates, relative: up to 1.5 scrape
    intervals over the span the series were sampled (compare's module docstring says why).
    With 1 s scrapes and no settling, 3-4 samples and errors up to 49% were seen."""
    return 1.5 / (r["samples"] - 1)


def test_shares_and_fractions_track_the_truth(results):
    for name, r in results.items():
        assert r["share_sum"] == pytest.approx(1.0, abs=1e-6), name  # every op's, register's too
        # register runs in the warm-up only: its share (3e-5 once, with 250 ms scrapes) is
        # what the four measured ops leave.
        shares = [c["share"][0] for c in r["ops"].values()]
        assert 1 - 1e-3 <= sum(shares) <= 1 + 1e-6, name
        whole, eps = r["with_warmup"], _extrapolation(r)
        assert eps < 0.25, (name, r["samples"])  # else the run is too short to judge
        for op, c in r["ops"].items():
            rules, truth = c["share"]
            slack = 0.01 + eps * max(truth, whole["share"][op])
            assert _between(rules, truth, whole["share"][op], slack), (
                name, op, rules, truth, whole["share"][op], slack)
        for role, (rules, truth) in r["roles"].items():
            slack = 0.01 + eps * max(truth, whole["roles"][role])
            assert _between(rules, truth, whole["roles"][role], slack), (
                name, role, rules, truth, whole["roles"][role], slack)
        # Busy and exposed: the job's rules against the workload's clock, between the
        # measured steps' and the whole run's, as for the roles.
        for what in ("busy", "exposed"):
            rules, truth = r["critical"][what]
            slack = 0.01 + eps * max(truth, whole["critical"][what])
            assert _between(rules, truth, whole["critical"][what], slack), (
                name, what, rules, truth, whole["critical"][what], slack)
        # The guard's time is one part of dpobs's own, beside the client's and the codec's.
        assert 0 < r["guard"] < r["own"], name


def test_the_table_names_every_backend_and_op(results):
    text = compare.table(results)
    for name in results:
        assert name in text.splitlines()[2]
    # the stack's Prometheus has native histograms on: every quantile cell is native
    assert {r["quantiles"] for r in results.values()} == {"native"}
    assert text.splitlines()[3].split()[:2] == ["quantiles", "from"]
    for op in ("put", "get", "list", "clear"):
        assert f"\n  {op}\n" in text
