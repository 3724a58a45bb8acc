"""The simulated cluster the multi-node test (tests/agent/) and the Prometheus source test
(tests/readback/) share: two nodes, each a network namespace with a veth pair to a hub
namespace, its own file_sd directory, its own `dpobs agent` and two training processes
(dpobs_otel.testing.cluster_workload); the hub runs one central Prometheus (remote-write
receiver, the mixin's rules). Every namespace and address is made here
(dpobs_otel/testing/netns.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dpobs_otel.testing.netns import Netns, can_make_namespaces, link
from dpobs_otel.testing.prometheus import Agent, Central, rule_files
from dpobs_otel.testing.stack import later_than

from . import IN_CI

WORKLOAD = "dpobs_otel.testing.cluster_workload"
JOB = "dpobs-mn"
SHARED_PORT = 9310  # both rollouts, one per node
CENTRAL_PORT = 9090
OUTAGE_S = 60  # the central Prometheus down, in the agent test's fixture
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
    if IN_CI:
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
            argv = [sys.executable, "-m", WORKLOAD, "--role", role, "--rank", str(rank),
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
        # A couple of rule evaluations over them: every rule group's last evaluation began a
        # whole interval after the final samples were queryable, so two began after that.
        after = time.time() + float(self.central.interval.removesuffix("s"))
        wait_for(lambda: self.evaluated_since(after), 60, "two rule evaluations", every=0.2)

    def evaluated_since(self, after: float) -> bool:
        """Whether every rule group of the central Prometheus has begun an evaluation since
        the wall-clock time `after` (the namespaces share this machine's clock)."""
        groups = self.central.rules()
        return bool(groups) and all(later_than(g["lastEvaluation"], after) for g in groups)

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
