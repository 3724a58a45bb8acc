"""Fixtures of the live Mooncake tests: a master on loopback per test module, a store, and a
fresh data plane per test. The test modules import helpers.mooncake, which skips them when
the mooncake wheel is not installed; this file imports it only inside the fixtures, which
run after that import succeeded (a skip raised while a conftest imports is an error)."""
from __future__ import annotations

import pytest

from dpobs_otel.adapters.mooncake import MooncakeDataPlane
from dpobs_otel.testing.mooncake import MooncakeMaster



@pytest.fixture(scope="module")
def master():
    from helpers.mooncake import LEASE_MS

    with MooncakeMaster(lease_ms=LEASE_MS) as m:
        yield m


@pytest.fixture(scope="module")
def store(master):
    s = master.connect()
    yield s
    s.close()


@pytest.fixture
def dp(store, master):
    from helpers.mooncake import namespaces

    plane = MooncakeDataPlane(store, namespace=f"t{next(namespaces)}", lease_s=master.lease_s)
    yield plane
    plane.close()
