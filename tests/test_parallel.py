"""The suite's parallel run (Makefile, helpers/parallel.py): each xdist worker's Ray has a temp
dir of its own, each worker's free ports come from a range of its own, and exactly the tests
that compare two clocks are set apart for the serial pass, so splitting the run in two loses
no test."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from helpers.parallel import FIRST_PORT, ray_tmpdir, worker_ports

from dpobs_otel.testing.processes import (PORTS_ENV, RAY_WORKER_PORTS, _Turn, free_port,
                                          port_ranges)

FILES = ["tests/test_critical.py", "tests/demo/test_workload.py", "tests/test_names.py"]
CLOCK_TESTS_OF_WORKLOAD = "tests/demo/test_workload.py::test_busy_and_exposed_agree_with_the"


def _ids(*args: str) -> set[str]:
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only",
                        "-p", "no:cacheprovider", *args, *FILES],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return {line for line in r.stdout.splitlines() if "::" in line}


def test_each_worker_of_each_run_gets_its_own_ray_temp_dir():
    assert ray_tmpdir({}) is None  # a serial run keeps Ray's default
    dirs = {ray_tmpdir({"PYTEST_XDIST_WORKER": w, "PYTEST_XDIST_TESTRUNUID": run})
            for w in ("gw0", "gw1") for run in ("a1b2c3d4e5f6", "0f9e8d7c6b5a")}
    assert len(dirs) == 4
    # Ray's socket paths (about 70 bytes below a session dir) stay under the 107-byte limit.
    assert all(len(d) <= 24 for d in dirs), dirs


def test_ray_takes_the_worker_s_temp_dir():
    env = {**os.environ, "RAY_TMPDIR": ray_tmpdir(
        {"PYTEST_XDIST_WORKER": "gw3", "PYTEST_XDIST_TESTRUNUID": "abcdef0123"})}
    r = subprocess.run([sys.executable, "-c", "from ray._common.utils import "
                        "get_default_ray_temp_dir as d; print(d())"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "/tmp/dpobs-abcdef-gw3/ray"
    if os.environ.get("PYTEST_XDIST_WORKER"):  # this very run, under `make test`
        assert os.environ["RAY_TMPDIR"] == ray_tmpdir(os.environ)


def test_the_two_passes_split_the_tests_and_lose_none():
    every, alone, rest = _ids(), _ids("-m", "alone"), _ids("-m", "not alone")
    critical = {i for i in every if i.startswith("tests/test_critical.py::")}
    workload = {i for i in every if i.startswith(CLOCK_TESTS_OF_WORKLOAD)}
    assert critical and len(workload) == 2
    assert alone == critical | workload  # every user of no_gc, and nothing else
    assert alone | rest == every and not alone & rest


def _ports(monkeypatch, count: int = 40) -> range:
    """Sets DPOBS_TEST_PORTS so that free_port() has `count` ports, and returns them: the first
    of this worker's own under xdist (no other worker uses them), else from FIRST_PORT."""
    own = port_ranges()
    low = own[0].start if own else FIRST_PORT
    monkeypatch.setenv(PORTS_ENV, f"{low}-{low + count + RAY_WORKER_PORTS - 1}")
    return port_ranges()[0]


def _hold(ports: range) -> dict[int, socket.socket]:
    """Binds every port of `ports` it can (the others are bound already, elsewhere)."""
    held = {}
    for port in ports:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
        else:
            held[port] = s
    return held


def test_free_port_takes_the_ports_of_the_range_in_turn(monkeypatch):
    ports = _ports(monkeypatch)
    got = [free_port() for _ in range(5)]
    assert all(port in ports for port in got), (got, ports)
    assert len(set(got)) == 5, got


def test_free_port_skips_a_bound_port_and_says_when_the_range_is_full(monkeypatch):
    ports = _ports(monkeypatch)
    held = _hold(ports)
    try:
        with pytest.raises(RuntimeError, match=PORTS_ENV):
            free_port()
        last = held.popitem()  # one port of the range free again: the one free_port() can give
        last[1].close()
        assert [free_port() for _ in range(3)] == [last[0]] * 3
    finally:
        for s in held.values():
            s.close()


@pytest.mark.parametrize("value", ["20000", "20000-", "a-b", "21000-20000", "20000-20199",
                                   "0-5000", "60000-65536", "1-2-3"])
def test_a_malformed_range_is_a_value_error_that_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(PORTS_ENV, value)
    with pytest.raises(ValueError, match=PORTS_ENV):
        free_port()


def test_processes_given_one_range_start_apart():
    size = 1300
    starts = sorted(_Turn(pid).next(size) for pid in range(4000, 4008))
    gaps = [b - a for a, b in zip(starts, starts[1:])] + [starts[0] + size - starts[-1]]
    assert min(gaps) >= size // 20, starts


def test_each_worker_gets_ports_of_its_own_below_the_ephemeral_range():
    assert worker_ports({}) is None and port_ranges({}) is None  # a serial run: bind to port 0
    taken = []
    for i in range(8):
        free, ray = port_ranges({PORTS_ENV: worker_ports({"PYTEST_XDIST_WORKER": f"gw{i}"})})
        assert len(ray) == RAY_WORKER_PORTS and len(free) > 1000 and not set(free) & set(ray)
        taken += [*free, *ray]
    assert len(set(taken)) == len(taken)  # no port in two workers' slices
    assert 20000 <= min(taken) and max(taken) <= 32767
    if os.environ.get("PYTEST_XDIST_WORKER"):  # this very run, under `make test`
        assert os.environ[PORTS_ENV] == worker_ports(os.environ)
