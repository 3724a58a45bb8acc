"""A cluster started by `ray start --head` from a clean environment (no DPOBS_* anywhere in
it): the job's driver runs with DPOBS_AUTO=1 and hands the variables to its actors through
runtime_env alone, the only way they reach the workers the raylet starts. Every worker is
measured; Ray's own processes (the raylet, GCS, agents), which never see the variables, run
no dpobs. The head runs in a session of its own, stopped by its process group."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dpobs_otel.testing.processes import free_port, port_ranges
from dpobs_otel.testing.transferqueue import LOOPBACK_ENV
from helpers.ray_runs import run_job

# In the serial pass (Makefile), not beside other workers: in the first parallel run of the
# suite (docs/development/testing.md) this job's Rollout actor died "before it started
# running" while three other workers were starting their clusters; alone it passes (13 s).
pytestmark = pytest.mark.alone

RAY = Path(sys.executable).with_name("ray")


def _up(port: int, head: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert head.poll() is None, head.communicate()[0][-3000:]
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"ray start --head: no GCS on port {port} within {timeout} s")


# The head's auth mode, and the driver's. The driver must not inherit another mode from this
# process: a local Ray started in it earlier (a TransferQueue module's, in the same pass) left
# RAY_AUTH_MODE=token in os.environ, and a token driver's actors on this head were cancelled
# before they started (the failure this test met in its serial pass since the first runs).
NO_TOKEN = {"RAY_AUTH_MODE": "disabled"}


@pytest.fixture
def head():
    temp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths are bounded
    # Token authentication off, as for the suite's other local clusters: a driver would
    # otherwise need the head's token file.
    clean = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
             **NO_TOKEN, **LOOPBACK_ENV}
    # Under DPOBS_TEST_PORTS (an xdist worker's own), Ray's workers take its top ports; unset,
    # Ray's default 10002-19999.
    ranges = port_ranges()
    workers = [] if ranges is None else [f"--min-worker-port={ranges[1][0]}",
                                         f"--max-worker-port={ranges[1][-1]}"]
    for attempt in range(3):  # the port is free when picked, maybe not when Ray binds it
        port = free_port()
        proc = subprocess.Popen(
            [str(RAY), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
             f"--port={port}", "--num-cpus=4", "--include-dashboard=false",
             "--disable-usage-stats", f"--temp-dir={temp}", *workers],
            env=clean, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        try:
            _up(port, proc)
            break
        except AssertionError:
            if attempt == 2:
                raise
    try:
        yield f"127.0.0.1:{port}"
    finally:
        # SIGTERM to `ray start` alone: it drains the node through the GCS, then stops the
        # processes it started. Sent to the whole group, it stopped the GCS too, and the drain
        # waited out its 30 s timeout on every run. Whatever of the group is left is killed.
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        shutil.rmtree(temp, ignore_errors=True)


def test_workers_of_a_ray_start_cluster_are_measured_through_runtime_env(head, tmp_path):
    job = run_job(tmp_path, RAYJOB_ADDRESS=head, DPOBS_AUTO="1", **NO_TOKEN,
                  DPOBS_SD_DIR=str(tmp_path / "sd"))
    roles = sorted(m["labels"]["role"] for m in job["metrics"])
    assert roles == ["Critic", "Rollout", "Rollout", "Scorer", "driver"]
    scorer = next(m["samples"] for m in job["metrics"] if m["labels"]["role"] == "Scorer")
    returned = sum(v for n, labels, v in scorer
                   if n == "dpobs_client_transferred_bytes_total"
                   and labels.get("op") == "ray_return" and labels["method"] == "Scorer.score")
    assert returned == job["result_sizes"]["Scorer.score"]
