"""Ray's own node exporters discovered beside dpobs's processes (issue 44, item 1): a measured
driver with an sd_dir announces each node's metrics export port there, labelled so the rules
can select it and dpobs's readers skip it, and the entry goes with Ray or with the driver,
however it goes (adapters/ray/nodes.py). A live Prometheus scraping it: test_ray_store_alerts.py.
"""
from __future__ import annotations

import fnmatch
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from dpobs_otel import names
from dpobs_otel.adapters.ray.nodes import NodeTargets, exporters
from dpobs_otel.agent.config import agent_config
from dpobs_otel.exporters.filesd import sweep
from dpobs_otel.testing.prometheus import Agent, Central
from helpers.ray_nodes import PATTERN, files, until
from helpers.ray_runs import TESTS, run_job
from dpobs_otel.testing.transferqueue import LOOPBACK_ENV

JOB = "raynodes"


@pytest.fixture(scope="module")
def announced(tmp_path_factory):
    """One driver's run: Ray up, its node announced, Ray down (helpers/ray_nodes.py)."""
    tmp = tmp_path_factory.mktemp("ray-nodes")
    sd = tmp / "sd"
    out = run_job(tmp, "helpers.ray_nodes", timeout=120, DPOBS_AUTO="1", DPOBS_SD_DIR=str(sd),
                  DPOBS_JOB=JOB)
    return out, sd


def test_each_alive_node_is_announced_at_its_metrics_export_port(announced):
    out, _ = announced
    [node] = out["nodes"]  # one local Ray: one node, as Ray itself lists it
    address, port = node["NodeManagerAddress"], node["MetricsExportPort"]
    [(name, doc)] = out["files"].items()
    assert doc == [{"targets": [f"{address}:{port}"],
                    "labels": {"job": JOB, "role": names.ROLE_RAY_NODE, "node": address,
                               names.SOURCE_LABEL: names.SOURCE_RAY}}]
    assert fnmatch.fnmatch(name, PATTERN) and name.endswith(".0.json")  # a shared target


def test_the_target_serves_ray_s_series_of_the_node_it_is_labelled_with(announced):
    out, _ = announced
    [(target, lines)] = out["lines"].items()
    node = out["nodes"][0]["NodeManagerAddress"]
    assert lines, "Ray's exporter served no ray_object_store_memory"
    # Ray labels its own series with NodeAddress: the entry's node label is that address.
    assert all(f'NodeAddress="{node}"' in line for line in lines), lines


def test_dpobs_s_readers_list_it_only_among_the_stores(announced):
    out, _ = announced
    target = next(iter(out["lines"]))
    assert target not in out["readers"]["processes"]  # the driver's own endpoint is there
    assert len(out["readers"]["processes"]) == 1
    assert target in out["readers"]["stores"]


def test_ray_shutdown_withdraws_it_and_the_driver_leaves_nothing(announced):
    out, sd = announced
    assert out["after_shutdown"] == {}
    assert files(str(sd)) == {} and not list(sd.glob(".dpobs-*"))


def test_a_killed_driver_s_entry_is_swept(tmp_path):
    """SIGKILL runs no exit handler: the entry stays, and the sweep (every dpobs.start(), the
    agent's cleaner) removes it because no live process holds its lock any more."""
    sd = tmp_path / "sd"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPOBS_", "OTEL_"))}
    env.update(LOOPBACK_ENV, PYTHONPATH=str(TESTS), DPOBS_AUTO="1", DPOBS_SD_DIR=str(sd),
               DPOBS_JOB=JOB, RAYNODES_HOLD="1")
    out = tmp_path / "out.json"
    proc = subprocess.Popen([sys.executable, "-m", "helpers.ray_nodes", str(out)], env=env,
                            cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # A hang guard, not a time: beside two matrix cells (load 12 on 2 cores) the driver
        # had not started its Ray in 90 s.
        deadline = time.monotonic() + 240
        while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert out.exists(), f"the driver did not get as far as its entry (rc {proc.poll()})"
        held = json.loads(out.read_text())["files"]
        assert held and set(held) == set(files(str(sd)))
        assert sweep(str(sd)) == []  # its driver lives: kept
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray it started
        proc.wait(timeout=30)
    assert set(files(str(sd))) == set(held)  # nothing removed it
    swept = [Path(p).name for p in sweep(str(sd))]  # the driver's own file with it
    assert sorted(n for n in swept if fnmatch.fnmatch(n, PATTERN)) == sorted(held)
    assert files(str(sd)) == {}


def test_the_agent_s_file_sd_reads_the_entry_beside_the_processes(tmp_path):
    """The configs read every *.json in the directory: the node's file among them."""
    cfg = agent_config(str(tmp_path), "http://127.0.0.1:9/api/v1/write", "n1")
    [pattern] = [f for sc in cfg["scrape_configs"] for c in sc.get("file_sd_configs", [])
                 for f in c["files"]]
    name = "ray-node-job-127.0.0.1_4000@0123456789ab.0.json"
    assert fnmatch.fnmatch(str(tmp_path / name), pattern)


@pytest.mark.parametrize("nodes, want", [
    ([{"Alive": True, "NodeManagerAddress": "10.0.0.2", "MetricsExportPort": 8080}],
     {"10.0.0.2:8080": "10.0.0.2"}),
    # A dead node, a node without an exporter (port 0: Ray's metrics off): neither announced.
    ([{"Alive": False, "NodeManagerAddress": "10.0.0.3", "MetricsExportPort": 8080},
      {"Alive": True, "NodeManagerAddress": "10.0.0.4", "MetricsExportPort": 0}], {}),
    ([{"Alive": True, "NodeManagerAddress": "fd00::5", "MetricsExportPort": 9}],
     {"[fd00::5]:9": "fd00::5"}),
])
def test_which_nodes_are_announced(nodes, want):
    assert exporters(nodes) == want


class FakeRay:
    """What NodeTargets.refresh asks of Ray: the node list, whether Ray is up."""

    def __init__(self, nodes):
        self.list, self.up = nodes, True

    def nodes(self):
        if isinstance(self.list, Exception):
            raise self.list
        return self.list

    def is_initialized(self):
        return self.up


def _node(target, alive=True):
    address, _, port = target.rpartition(":")
    return {"Alive": alive, "NodeManagerAddress": address, "MetricsExportPort": int(port)}


def test_nodes_that_join_are_announced_and_dead_ones_withdrawn(tmp_path):
    errors = []
    tel = types.SimpleNamespace(settings=types.SimpleNamespace(sd_dir=str(tmp_path), job=JOB),
                                internal_error=lambda c, e: errors.append((c, e)))
    targets = NodeTargets(tel)  # not started: refreshed by hand here
    with socket.create_server(("127.0.0.1", 0)) as one, \
            socket.create_server(("127.0.0.1", 0)) as two:
        first, second = (f"127.0.0.1:{s.getsockname()[1]}" for s in (one, two))
        ray = FakeRay([_node(first)])
        assert targets.refresh(ray) == 0
        ray.list = [_node(first, alive=False), _node(second)]
        assert targets.refresh(ray) == 0
        held = {t for doc in files(str(tmp_path)).values() for e in doc for t in e["targets"]}
        assert held == {second} and targets.announced == [second]
        ray.list = RuntimeError("GCS unreachable")  # kept as it was, counted, never raised
        assert targets.refresh(ray) == 0
        assert targets.announced == [second]
        assert [(c, str(e)) for c, e in errors] == [(names.COMPONENT_FILE_SD, "GCS unreachable")]
        ray.up = False  # the same failure while Ray shuts down is no error of dpobs's
        targets.refresh(ray)
        assert len(errors) == 1
    targets.close()
    assert files(str(tmp_path)) == {}


def test_a_port_nothing_serves_is_not_announced_until_it_answers(tmp_path):
    """A bare Ray lists its nodes' metrics export ports though no agent serves them."""
    tel = types.SimpleNamespace(settings=types.SimpleNamespace(sd_dir=str(tmp_path), job=JOB),
                                internal_error=lambda c, e: pytest.fail(repr(e)))
    targets = NodeTargets(tel)
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    ray = FakeRay([_node(f"127.0.0.1:{port}")])  # closed now: nothing listens there
    assert targets.refresh(ray) == 1 and files(str(tmp_path)) == {}
    with socket.create_server(("127.0.0.1", port)):
        assert targets.refresh(ray) == 0
        assert targets.announced == [f"127.0.0.1:{port}"]
    targets.close()


class _RayExporter(http.server.BaseHTTPRequestHandler):
    """A Ray node's metrics export port, as far as a scraper sees it: one of its gauges."""
    BODY = (b"# TYPE ray_object_store_available_memory gauge\n"
            b'ray_object_store_available_memory{Component="raylet",NodeAddress="127.0.0.1"}'
            b" 1234\n")

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.BODY)))
        self.end_headers()
        self.wfile.write(self.BODY)

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_through_dpobs_agent_the_node_s_series_keep_ray_s_node(tmp_path):
    """The agent's `node` is an external label: a series that has one (the Ray node entry's
    target label) keeps its own on the way to the central side, so the driver's node's agent
    can scrape every node of the cluster."""
    sd = tmp_path / "sd"
    tel = types.SimpleNamespace(settings=types.SimpleNamespace(sd_dir=str(sd), job=JOB),
                                internal_error=lambda c, e: pytest.fail(repr(e)))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RayExporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    targets = NodeTargets(tel)
    try:
        assert targets.refresh(FakeRay([_node(f"127.0.0.1:{server.server_port}")])) == 0
        with Central([]) as central, \
                Agent(str(sd), f"{central.url}/api/v1/write", "agent-node"):
            got = until(lambda: central.query(f'ray_object_store_available_memory{{job="{JOB}"}}'),
                        timeout=60)
    finally:
        targets.close()
        server.shutdown()
        server.server_close()
    [series] = got
    labels = {k: series["metric"][k] for k in ("node", "role", names.SOURCE_LABEL)}
    assert labels == {"node": "127.0.0.1", "role": names.ROLE_RAY_NODE,
                      names.SOURCE_LABEL: names.SOURCE_RAY}
    assert series["value"] == 1234
