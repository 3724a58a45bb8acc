"""The suite's parallel run (Makefile, helpers/parallel.py): each xdist worker's Ray has a temp
dir of its own, and exactly the tests that compare two clocks are set apart for the serial
pass, so splitting the run in two loses no test."""
from __future__ import annotations

import os
import subprocess
import sys

from helpers.parallel import ray_tmpdir

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
