"""What running the suite in parallel workers needs (Makefile: pytest-xdist, a module to a
worker; docs/development/testing.md): a Ray temp dir and a range of ports per worker, and the
tests that compare two clocks set apart to run alone, in the serial pass after the parallel
one."""
from __future__ import annotations

import pytest

ALONE = "alone"
# Worker gw<i>'s DPOBS_TEST_PORTS (dpobs_otel/testing/processes.py): PORTS ports from
# FIRST_PORT + PORTS * i; WORKER_SLICES slices, all below Linux's ephemeral range (32768 up).
FIRST_PORT, PORTS, WORKER_SLICES = 20000, 1500, 8
# The fixture a test asks for when it compares two clocks (tests/conftest.py).
CLOCKS = "no_gc"


def ray_tmpdir(environ) -> str | None:
    """The RAY_TMPDIR of this process when it is an xdist worker, else None. Every local Ray
    otherwise shares /tmp/ray, its session_latest link and ray_current_cluster, so a driver
    of one worker asking for address="auto" could join another worker's cluster. The run's id
    keeps two parallel runs apart (make compat's cells beside make test); short, because Ray's
    Unix socket paths live under it (107 bytes at most)."""
    worker = environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return None
    return f"/tmp/dpobs-{environ.get('PYTEST_XDIST_TESTRUNUID', '')[:6]}-{worker}"


def worker_ports(environ) -> str | None:
    """DPOBS_TEST_PORTS for this process when it is an xdist worker ("LOW-HIGH"), else None.
    A ninth worker shares the first's slice: free_port() skips a port bound at the time and
    starts from an offset of its pid."""
    worker = environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return None
    low = FIRST_PORT + PORTS * (int(worker.removeprefix("gw")) % WORKER_SLICES)
    return f"{low}-{low + PORTS - 1}"


def mark_alone(items) -> None:
    """Marks `alone` every test that compares two clocks: a second worker's load would land
    inside one clock's interval and not the other's."""
    for item in items:
        if CLOCKS in getattr(item, "fixturenames", ()):
            item.add_marker(getattr(pytest.mark, ALONE))
