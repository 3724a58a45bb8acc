"""The receiver tests' run (tests/agent/test_receivers.py, test_victoria.py): two nodes'
`dpobs agent`s on loopback (node-a, node-b), each with one training process of the same role
and rank (dpobs_otel.testing.cluster_workload), writing to one receiver through an outage of
it; and the checks every receiver must pass: each process's classic counts exact, the
outage's samples replayed from the agents' WALs."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from dpobs_otel.names import OP_DURATION_NATIVE_SERIES
from dpobs_otel.testing.prometheus import Agent

from .multinode import wait_for

WORKLOAD = "dpobs_otel.testing.cluster_workload"
JOB = "dpobs-mn"
NODES = ("node-a", "node-b")
OUTAGE_S = 8
# DpobsAgentDeliveryFailing's knobs shortened so it fires within the test (1 s scrapes).
KNOBS = dict(agent_delivery_window="15s", agent_delivery_for="5s")


def failing(receiver) -> set[tuple[str, str]]:
    """(node, queue) of each DpobsAgentDeliveryFailing firing now (the rules API: an ALERTS
    sample from before a restart stays visible to queries for the 5m lookback)."""
    return {(a["labels"]["node"], a["labels"]["remote_name"]) for a in receiver.alerts()
            if a["labels"]["alertname"] == "DpobsAgentDeliveryFailing"
            and a["state"] == "firing"}


class Run:
    """Two nodes' agents and processes writing to `receiver` (anything with start(), stop(),
    query() and url), through one receiver outage."""

    def __init__(self, tmp: Path, receiver, native_modes: dict[str, str]):
        self.tmp, self.receiver, self.stop_file = tmp, receiver, tmp / "stop"
        self.truth: dict[str, dict] = {}
        self.procs: list[subprocess.Popen] = []
        self.agents = {n: Agent(str(tmp / n / "sd"), f"{receiver.url}/api/v1/write", n,
                                extra=["--native-histograms", native_modes[n]])
                       for n in NODES}

    def start(self) -> None:
        for node, agent in self.agents.items():
            (self.tmp / node / "sd").mkdir(parents=True)
            agent.start()
            argv = [sys.executable, "-m", WORKLOAD, "--role", "trainer", "--rank", "0",
                    "--sd-dir", str(self.tmp / node / "sd"), "--truth",
                    str(self.tmp / f"truth-{node}.json"), "--stop-file", str(self.stop_file),
                    "--compute-s", "0.05"]
            log = open(self.tmp / f"{node}.log", "wb")
            with log:
                self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))

    def steps(self, **at) -> dict[str, float]:
        got = self.receiver.query(f'dpobs_step_duration_seconds_count{{job="{JOB}"}}', **at)
        return {r["metric"]["node"]: r["value"] for r in got}

    def outage(self) -> tuple[float, float]:
        """The receiver down for OUTAGE_S while training goes on; back on its data."""
        wait_for(lambda: len(self.steps()) == 2, 90, "both processes at the receiver")
        self.receiver.stop()
        down = time.time()
        time.sleep(OUTAGE_S)
        up = time.time()
        self.receiver.start()
        return down, up

    def finish(self) -> None:
        self.stop_file.touch()
        for node in NODES:
            path = self.tmp / f"truth-{node}.json"
            wait_for(path.exists, 60, path.name)
            self.truth[node] = json.loads(path.read_text())
        want = {n: float(t["steps"]) for n, t in self.truth.items()}
        wait_for(lambda: self.steps() == want, 60, f"final counts {want}")

    def close(self) -> None:
        """Everything stopped at once; while the receiver is still up, or each agent waits
        its flush deadline on shutdown. Safe to call twice."""
        for p in self.procs:
            p.terminate()
        for agent in self.agents.values():
            if agent.proc is not None and agent.proc.poll() is None:
                agent.proc.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
        for agent in self.agents.values():
            agent.close()

    def logs(self) -> str:
        return "\n".join(f"--- agent {n}\n{a.log()}" for n, a in self.agents.items())


def exact_counts(run: Run) -> None:
    """Every process's classic series as its own truth has them, none merged."""
    q = run.receiver.query
    calls = {(r["metric"]["node"], r["metric"]["op"]): r["value"] for r in q(
        f'dpobs_client_operation_duration_seconds_count{{job="{JOB}"}}')}
    want = {(n, op): float(d["calls"]) for n, t in run.truth.items()
            for op, d in t["ops"].items()}
    assert calls == want, (calls, want)
    ups = q(f'up{{job="{JOB}"}}')
    assert sorted((r["metric"]["node"], r["metric"]["instance"]) for r in ups) == \
        sorted((n, t["endpoint"]) for n, t in run.truth.items())


def replayed(run: Run, down: float, up: float) -> dict[str, float]:
    """Samples per process inside the outage (less its edges), from the agents' WALs."""
    inside = int(up - down - 2)
    got = run.receiver.query(f'count_over_time(dpobs_step_duration_seconds_count'
                             f'{{job="{JOB}"}}[{inside}s])', at=up - 1)
    counted = {r["metric"]["node"]: r["value"] for r in got}
    for node in NODES:  # 1 s scrapes: all but a couple reached the receiver
        assert counted.get(node, 0) >= inside - 2, (node, counted, inside)
    return counted


def native_counts(run: Run) -> dict[tuple, float]:
    got = run.receiver.query(f'histogram_count({OP_DURATION_NATIVE_SERIES}{{job="{JOB}"}})')
    return {(r["metric"]["node"], r["metric"]["op"]): r["value"] for r in got}


def native_series(receiver) -> int:
    """How many native-family series the receiver holds, by name alone (no native function
    needed: VictoriaMetrics 1.79 has none)."""
    got = receiver.query(f'count({{__name__="{OP_DURATION_NATIVE_SERIES}"}})')
    return int(got[0]["value"]) if got else 0


