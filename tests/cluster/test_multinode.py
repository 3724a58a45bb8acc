"""Two simulated nodes, real binaries: each node is a network namespace with a veth pair to
a hub namespace, its own file_sd directory, its own `dpobs agent` and two training
processes; the hub runs one central Prometheus (remote-write receiver, the mixin's rules).
Every namespace and address here is made by this test (see cluster_harness.py).

The rollout processes of both nodes bind the same 127.0.0.1:9310 in their own namespaces,
so they publish the same instance, role and rank: only `node` tells them apart. Everything
is checked against the workload's own truth. Then the faults: the central Prometheus stops
for 60 s while training goes on and restarts on the same port and data (the agents' WALs
replay: counts over the whole run still equal the truth, and the outage has its samples),
and one agent is killed (DpobsAgentDown fires for its node only; the other node's series
stay fresh and unchanged).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from bisect import bisect_right
from pathlib import Path

import pytest
from cluster_harness import Agent, Central, Netns, can_make_namespaces, link, rule_files

pytestmark = pytest.mark.slow

WORKLOAD = Path(__file__).with_name("cluster_workload.py")
JOB = "dpobs-mn"
SHARED_PORT = 9310  # both rollouts, one per node
CENTRAL_PORT = 9090
OUTAGE_S = 60
REL = 0.05
# (node, role, rank, port, compute seconds per step): frac_of_step differs per process, so
# merged series could not match any one process's truth.
PROCESSES = [("node-a", "rollout", 0, SHARED_PORT, 0.02),
             ("node-a", "trainer", 0, 9311, 0.06),
             ("node-b", "rollout", 0, SHARED_PORT, 0.09),
             ("node-b", "trainer", 1, 9312, 0.03)]
NODES = sorted({p[0] for p in PROCESSES})
# The alert's knobs shortened so it fires within the test (the shipped defaults: 120 s, 2m).
AGENT_KNOBS = dict(agent_stale_seconds=15, agent_down_for="10s")


def require_namespaces() -> None:
    reason = can_make_namespaces()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true: the multi-node test must run ({reason})")
    pytest.skip(f"multi-node test: {reason}")


def wait_for(fn, timeout: float, what: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


class Cluster:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.stop_file = tmp / "stop"
        self.ns: dict[str, Netns] = {}
        self.agents: dict[str, Agent] = {}
        self.procs: list[subprocess.Popen] = []
        self.central: Central | None = None
        self.truth: dict[tuple, dict] = {}

    def start(self) -> None:
        hub = self.ns["hub"] = Netns().__enter__()
        rules = rule_files(self.tmp / "mixin", **AGENT_KNOBS)
        self.central = Central(rules, ns=hub, port=CENTRAL_PORT, bind="0.0.0.0",
                               data_dir=str(self.tmp / "central"))
        (self.tmp / "central").mkdir()
        self.central.start()
        for i, node in enumerate(NODES, start=1):
            ns = self.ns[node] = Netns().__enter__()
            hub_ip, _ = link(hub, ns, i)
            sd = self.tmp / node / "sd"
            sd.mkdir(parents=True)
            agent = self.agents[node] = Agent(
                str(sd), f"http://{hub_ip}:{CENTRAL_PORT}/api/v1/write", node, ns=ns,
                listen="127.0.0.1:9095")
            agent.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPOBS_")}
        for node, role, rank, port, compute in PROCESSES:
            argv = [sys.executable, str(WORKLOAD), "--role", role, "--rank", str(rank),
                    "--port", str(port), "--sd-dir", str(self.tmp / node / "sd"),
                    "--truth", str(self.truth_path(node, role, rank)),
                    "--stop-file", str(self.stop_file), "--compute-s", str(compute)]
            log = open(self.tmp / f"{node}-{role}-{rank}.log", "wb")
            with log:
                self.procs.append(self.ns[node].popen(argv, env=env, stdout=log,
                                                      stderr=subprocess.STDOUT))

    def truth_path(self, node, role, rank) -> Path:
        return self.tmp / f"truth-{node}-{role}-{rank}.json"

    def processes_seen(self) -> int:
        got = self.central.query(f'count(group by (node, instance, role, rank) '
                                 f'(dpobs_step_duration_seconds_count{{job="{JOB}"}}))')
        return int(got[0]["value"]) if got else 0

    def finish(self) -> None:
        self.stop_file.touch()
        for node, role, rank, *_ in PROCESSES:
            path = self.truth_path(node, role, rank)
            wait_for(lambda: path.exists(), 60, f"{path.name}")
            truth = json.loads(path.read_text())
            self.truth[(node, truth["endpoint"], role)] = truth
        finished = max(t["finished"] for t in self.truth.values())
        # Until every process has a sample scraped after it stopped training (its final
        # counts), delivered to the central side.
        wait_for(lambda: len([r for r in self.central.query(
            f'timestamp(dpobs_step_duration_seconds_count{{job="{JOB}"}})')
            if r["value"] > finished + 0.5]) == len(PROCESSES), 60, "final scrapes")
        time.sleep(3)  # a couple of rule evaluations over them

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for agent in self.agents.values():
            agent.close()
        if self.central is not None:
            self.central.close()
        for ns in self.ns.values():
            ns.close()

    def logs(self) -> str:
        out = [f"--- agent {n}\n{a.log()}" for n, a in self.agents.items()]
        out += [f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                for p in self.tmp.glob("node-*.log")]
        return "\n".join(out)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_namespaces()
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.start()
        try:
            wait_for(lambda: c.processes_seen() == len(PROCESSES), 120, "all processes")
        except AssertionError:
            raise AssertionError(c.logs()) from None
        time.sleep(10)  # training, delivered as it goes
        c.central.stop()
        c.outage = (time.time(), None)
        time.sleep(OUTAGE_S)  # training goes on; the agents keep the samples in their WALs
        c.central.start()
        c.outage = (c.outage[0], time.time())
        time.sleep(15)
        c.finish()
        yield c
    finally:
        c.close()


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
