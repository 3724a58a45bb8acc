"""tel.cluster_step_metrics(prometheus_url) on the multi-node stack (the Cluster of
tests/helpers/multinode.py: two simulated nodes, an agent each, one central Prometheus with
the mixin's rules; no outage here), checked against the workload's truth and the recording
rules.

The rollouts of both nodes publish the same 127.0.0.1:9310, so only `node` tells them apart.
The driver calls twice: once as soon as every process is in the central Prometheus (its
first window counts every process since its start) and once after they stopped and their
final samples arrived. The two windows together must hold each op's calls, the steps and
the bytes exactly; their fractions and shares, and the second window's (nearly the whole
run, as the rules' 5m window is), must agree with the rules'.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers.multinode import JOB, PROCESSES, Cluster, require_namespaces, wait_for

import dpobs_otel as dpobs
from dpobs_otel.testing.netns import setns
from dpobs_otel.testing.prometheus import Central

pytestmark = pytest.mark.slow

P = "dpobs/cluster/"


def rule(central: Central, name: str, by: str | None = None):
    got = central.query(f'{name}{{job="{JOB}"}}')
    return {r["metric"][by]: r["value"] for r in got} if by else got[0]["value"]


def test_prometheus_source_matches_the_truth_and_the_recording_rules(tmp_path):
    require_namespaces()
    stack = Cluster(tmp_path)
    tel = dpobs.start(role="driver", rank=0, job=JOB, port=0)
    # the central Prometheus listens inside the hub namespace: call from a thread there
    hub_thread = ThreadPoolExecutor(1)
    try:
        stack.start()
        hub_thread.submit(setns, stack.ns["hub"].fd).result()
        url = stack.central.url
        call = lambda: hub_thread.submit(tel.cluster_step_metrics, url).result()  # noqa: E731
        wait_for(lambda: stack.processes_seen() == len(PROCESSES), 120, "every process")
        first = call()  # the first call: every process since its start
        assert first[P + "processes"] == 4 and first[P + "staleness_s"] >= 0
        time.sleep(20)  # the second window: nearly all of the run, as the rules' 5m are
        stack.finish()  # stopped, their truth written, their final samples delivered
        last = call()
        truths = list(stack.truth.values())
        _check_exact(first, last, truths)
        _check_rules(first, last, stack.central)
        cols, rows = tel.cluster_breakdown(url)
        # every call waits the store's 10 ms; a step gets twice and does the rest once
        assert rows[0][0] == "get" and rows[-1][:2] == ["register", 0]
        mean = rule(stack.central, "job_op:dpobs_client_operation_duration_seconds:mean_rate5m",
                    "op")
        for row in (dict(zip(cols, r)) for r in rows if r[1] > 0):  # with calls this window
            assert row["mean_ms"] == pytest.approx(1e3 * mean[row["op"]], rel=0.05), row
    finally:
        hub_thread.shutdown()
        stack.close()
        tel.shutdown()


def _check_exact(first: dict, last: dict, truths: list[dict]) -> None:
    """Both windows together: everything each process did, exactly."""
    assert last[P + "processes"] == 4 and last[P + "processes_lost"] == 0
    assert last[P + "processes_restarted"] == 0
    both = lambda k: first.get(k, 0) + last.get(k, 0)  # noqa: E731
    assert both(P + "steps") == sum(t["steps"] for t in truths)
    for op in truths[0]["ops"]:
        assert both(f"{P}op/{op}/calls") == sum(t["ops"][op]["calls"] for t in truths), op
        moved = sum(t["ops"][op]["read"] + t["ops"][op]["write"] for t in truths)
        assert round(both(f"{P}op/{op}/mb") * 1e6) == moved, op
    step_s = sum(t["step_s"] for t in truths)
    dp = sum(d["seconds"] for t in truths for d in t["ops"].values())
    # the workload's own clock brackets dpobs's: within 5 %, as the multi-node test allows
    assert both(P + "data_plane_s") / both(P + "step_s") == pytest.approx(dp / step_s, rel=0.05)


def _check_rules(first: dict, last: dict, central: Central) -> None:
    """Against the 5m recording rules, over a run shorter than 5m: the two windows together
    for the sums' ratios, the steady second window for the slowest process's fraction."""
    both = lambda k: first.get(k, 0) + last.get(k, 0)  # noqa: E731
    dp = both(P + "data_plane_s")
    assert dp / both(P + "step_s") == pytest.approx(
        rule(central, "job:dpobs_frac_of_step:ratio_rate5m"), rel=0.05)
    assert last[P + "frac_of_step"] == pytest.approx(
        rule(central, "job:dpobs_frac_of_step:ratio_rate5m"), rel=0.05)
    assert last[P + "frac_of_step_max"] == pytest.approx(
        rule(central, "job:dpobs_frac_of_step:max_ratio_rate5m"), rel=0.05)
    shares = rule(central, "job_op:dpobs_operation_share:ratio_rate5m", "op")
    assert {k.split("/")[3] for k in last if k.endswith("/share")} == set(shares)
    for op, share in shares.items():
        assert abs(both(f"{P}op/{op}/seconds") / dp - share) <= 0.02, (op, share)
        assert abs(last[f"{P}op/{op}/share"] - share) <= 0.02, (op, share)
    assert len(central.query(f'instance:dpobs_frac_of_step:ratio_rate5m{{job="{JOB}"}}')) == 4
    assert last[P + "outstanding_mb"] * 1e6 == rule(central,
                                                    "job:dpobs_client_outstanding_size_bytes:sum")
