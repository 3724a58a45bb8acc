"""Fixtures every folder shares: a fresh Telemetry per test (own registry, own port) and an
instrumented in-memory client; the scraper they are read with is in helpers."""
from __future__ import annotations

import os
import shutil

import pytest

import dpobs_otel as dpobs
from dpobs_otel.testing.processes import PORTS_ENV
from helpers import network_isolation
from helpers.durations import LIMIT_S, SlowTests, limit_for
from helpers.parallel import mark_alone, ray_tmpdir, worker_ports

# Ray, in any test that starts or joins it, stays on loopback with no usage stats (see
# dpobs_otel/testing/transferqueue.py); set here because test modules import ray before the harness.
os.environ.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
# Ray refuses to spill, or to fall back on disk, once the disk under its temp dir is 95% full
# by its own count (1 - available / capacity). A compat cell's tests run beside the next
# cell's virtualenv build (gigabytes of torch), which took a CI machine past that line, and
# the spilling tests failed (e05b517's landing run; docs/development/testing.md). The tests'
# stores spill a few hundred MiB at most: Ray refuses only a disk that is really full.
# test_ray_store_alerts's `full` run counts the disk full in its own _system_config, as before.
os.environ["RAY_local_fs_capacity_threshold"] = "1"
# Under pytest-xdist (`make test TEST_WORKERS=4`, make compat's parallel cells) each worker's
# Ray keeps its own temp dir (helpers/parallel.py says why); None in a serial run.
WORKER_RAY_TMPDIR = ray_tmpdir(os.environ)
if WORKER_RAY_TMPDIR:
    os.environ["RAY_TMPDIR"] = WORKER_RAY_TMPDIR
# ... and its own ports below the ephemeral range, for free_port() and a `ray start` cluster's
# workers (dpobs_otel/testing/processes.py); a serial run leaves DPOBS_TEST_PORTS as it is.
WORKER_PORTS = worker_ports(os.environ)
if WORKER_PORTS:
    os.environ[PORTS_ENV] = WORKER_PORTS


def pytest_unconfigure(config):
    # A worker's Ray temp dir goes with the worker: its clusters stopped with their modules.
    if WORKER_RAY_TMPDIR:
        shutil.rmtree(WORKER_RAY_TMPDIR, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    # A test that compares two clocks (it asks for `no_gc`, below) runs in the serial pass.
    mark_alone(items)


def pytest_addoption(parser):
    parser.addoption("--slow-limit", type=float, default=LIMIT_S, metavar="SECONDS",
                     help="fail the run when a test not on helpers/slow_allowlist.py takes "
                          "longer (default %(default)s); 0 only prints the slowest tests "
                          "(make compat's cells: make test enforces the limit)")


def pytest_configure(config):
    # Prints each run's slowest tests and fails a run with a test over the limit that is not
    # allowlisted (helpers/durations.py); it only reads reports, it changes no test.
    # In four xdist workers on 2 cores the limit is twice --slow-limit (limit_for).
    limit = limit_for(config.getoption("--slow-limit"),
                      getattr(config.option, "numprocesses", None), os.cpu_count())
    config.pluginmanager.register(SlowTests(limit_s=limit), "dpobs-slow-tests")


def pytest_report_header(config):
    reason = network_isolation()
    return ("network: loopback-only namespace" if reason is None
            else f"network: NOT isolated ({reason})")


@pytest.fixture
def tel(monkeypatch):
    for var in ("DPOBS_ROLE", "DPOBS_RANK", "DPOBS_PORT", "DPOBS_HOST", "DPOBS_SD_DIR",
                "DPOBS_VERIFY_TENSOR_HASH", "DPOBS_JOB", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(var, raising=False)
    t = dpobs.start(role="test", rank=0, port=0)
    yield t
    t.shutdown()


@pytest.fixture
def client(tel):
    return tel.instrument(dpobs.InMemoryDataPlane())


@pytest.fixture
def no_gc():
    """No garbage collection inside a test that compares two clocks: a collection of the
    objects earlier tests left (torch, TensorDicts) can pause for 100+ ms, and where it
    lands, inside one clock's interval and outside the other's, is chance."""
    import gc

    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
