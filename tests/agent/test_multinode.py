"""Two simulated nodes, real binaries: each node is a network namespace with a veth pair to
a hub namespace, its own file_sd directory, its own `dpobs agent` and two training
processes; the hub runs one central Prometheus (remote-write receiver, the mixin's rules).
Every namespace and address here is made by this test (tests/helpers/multinode.py).

The rollout processes of both nodes bind the same 127.0.0.1:9310 in their own namespaces,
so they publish the same instance, role and rank: only `node` tells them apart. Everything
is checked against the workload's own truth. Then the faults: the central Prometheus stops
for 60 s while training goes on and restarts on the same port and data (the agents' WALs
replay: counts over the whole run still equal the truth, and the outage has its samples),
and one agent is killed (DpobsAgentDown fires for its node only; the other node's series
stay fresh and unchanged).
"""
from __future__ import annotations

import time
from bisect import bisect_right

import pytest
from helpers.multinode import AGENT_KNOBS, JOB, PROCESSES, SHARED_PORT, wait_for

pytestmark = pytest.mark.slow

REL = 0.05


def key(metric: dict) -> tuple:
    """One process: what the per-process recording rules keep (DESIGN.md)."""
    return metric["node"], metric["instance"], metric["role"]


def by_process(results: list[dict], *more: str) -> dict:
    return {key(r["metric"]) + tuple(r["metric"][m] for m in more): r["value"] for r in results}


def close(got: float, want: float, rel: float = REL) -> bool:
    return abs(got - want) <= rel * abs(want)


def sel(metric: str, **labels) -> str:
    labels.setdefault("job", JOB)
    return metric + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def dp_seconds(truth: dict) -> float:
    return sum(d["seconds"] for d in truth["ops"].values())


def test_same_host_port_on_two_nodes_stays_two_processes(cluster):
    shared = f"127.0.0.1:{SHARED_PORT}"
    # the collision this test is about: same instance, role and rank on both nodes
    assert {("node-a", shared, "rollout"), ("node-b", shared, "rollout")} <= set(cluster.truth)
    assert cluster.processes_seen() == len(PROCESSES)
    up = cluster.central.query(sel("up"))
    assert {key(r["metric"]): r["value"] for r in up} == {k: 1.0 for k in cluster.truth}
    per = by_process(cluster.central.query("instance:dpobs_frac_of_step:ratio_rate5m"))
    assert set(per) == set(cluster.truth), per
    for k, truth in cluster.truth.items():
        want = dp_seconds(truth) / truth["step_s"]
        assert close(per[k], want), (k, per[k], want)


def test_counts_and_bytes_per_call_equal_the_truth_from_raw_last_values(cluster):
    steps = by_process(cluster.central.query(sel("dpobs_step_duration_seconds_count")))
    calls = by_process(cluster.central.query(sel("dpobs_client_operation_duration_seconds_count")),
                       "op")
    moved = by_process(cluster.central.query(sel("dpobs_client_transferred_bytes_total")),
                       "op", "direction")
    for k, truth in cluster.truth.items():
        assert steps[k] == truth["steps"], (k, steps[k], truth["steps"])
        for op, d in truth["ops"].items():
            assert calls[k + (op,)] == d["calls"], (k, op)
        put, get = truth["ops"]["put"], truth["ops"]["get"]
        assert moved[k + ("put", "write")] / calls[k + ("put",)] == put["write"] / put["calls"]
        assert moved[k + ("get", "read")] / calls[k + ("get",)] == get["read"] / get["calls"]


def test_frac_of_step_op_shares_and_bytes_per_call_from_the_rules(cluster):
    truths = list(cluster.truth.values())
    step_s = sum(t["step_s"] for t in truths)
    op_s = {op: sum(t["ops"][op]["seconds"] for t in truths) for op in truths[0]["ops"]}
    [job] = cluster.central.query(sel("job:dpobs_frac_of_step:ratio_rate5m"))
    assert close(job["value"], sum(op_s.values()) / step_s), job
    shares = {r["metric"]["op"]: r["value"] for r in cluster.central.query(
        sel("job_op:dpobs_operation_share:ratio_rate5m"))}
    assert set(shares) == set(op_s)
    for op, seconds in op_s.items():
        assert abs(shares[op] - seconds / sum(op_s.values())) <= 0.02, (op, shares)
    rates = {r["metric"]["op"]: r["value"] for r in cluster.central.query(
        sel("job_op:dpobs_client_operations:rate5m"))}
    for op, direction, field in (("put", "write", "write"), ("get", "read", "read")):
        [moved] = cluster.central.query(sel("job_op_direction:dpobs_client_transferred_bytes:"
                                            "rate5m", op=op, direction=direction))
        want = sum(t["ops"][op][field] for t in truths) / sum(t["ops"][op]["calls"]
                                                               for t in truths)
        assert close(moved["value"] / rates[op], want), (op, moved["value"] / rates[op], want)


def steps_at(truth: dict, when: float) -> int:
    times = [t for t, _ in truth["timeline"]]
    i = bisect_right(times, when)
    return truth["timeline"][i - 1][1] if i else 0


def test_the_agents_wal_replayed_the_central_outage(cluster):
    down, up = cluster.outage
    inside = f"[{int(up - down - 10)}s]"  # the outage, less its edges
    counted = by_process(cluster.central.query(
        f"count_over_time({sel('dpobs_step_duration_seconds_count')}{inside})", at=up - 5))
    mid = (down + up) / 2
    at_mid = by_process(cluster.central.query(sel("dpobs_step_duration_seconds_count"), at=mid))
    for k, truth in cluster.truth.items():
        # 1 s scrapes through a 60 s outage: every one of them reached the central side
        assert counted[k] >= 0.9 * (up - down - 10), (k, counted[k])
        # and each holds what the process had done by then: scraped within a second or so
        # of `mid` (the truth's clock is read just after dpobs counts a step: +1 s margin)
        assert steps_at(truth, mid - 3) <= at_mid[k] <= steps_at(truth, mid + 1), (k, at_mid[k])
    firing = cluster.central.query_range(
        'ALERTS{alertname="DpobsAgentDown", alertstate="firing"}', up, time.time())
    assert firing == [], "DpobsAgentDown fired because the central side was down"


def test_killed_agent_fires_for_its_node_and_leaves_the_other_alone(cluster):
    before = by_process(cluster.central.query(sel("dpobs_step_duration_seconds_count")))
    a_series = cluster.central.query(f'count({{node="node-a", job="{JOB}"}})')[0]["value"]
    cluster.agents["node-b"].kill()
    firing = wait_for(lambda: cluster.central.query(
        'ALERTS{alertname="DpobsAgentDown", alertstate="firing"}'), 120, "DpobsAgentDown")
    assert [r["metric"]["node"] for r in firing] == ["node-b"]
    now = time.time()
    fresh = cluster.central.query(f'timestamp({sel("up", node="node-a")})')
    # node-a still delivers: its newest samples are well inside the staleness the alert
    # judges by (a scrape interval plus remote-write delay, on a loaded box several seconds).
    stale = AGENT_KNOBS["agent_stale_seconds"]
    assert len(fresh) == 2 and all(now - r["value"] < stale * 2 / 3 for r in fresh), fresh
    assert cluster.central.query(f'count({{node="node-a", job="{JOB}"}})')[0]["value"] \
        == a_series
    after = by_process(cluster.central.query(sel("dpobs_step_duration_seconds_count",
                                                 node="node-a")))
    assert after == {k: v for k, v in before.items() if k[0] == "node-a"}
