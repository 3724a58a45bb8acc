"""Fixtures of the agent tests: the two-node cluster of tests/helpers/multinode.py, through
an outage of its central Prometheus (see test_multinode.py)."""
from __future__ import annotations

import time

import pytest
from helpers.multinode import OUTAGE_S, PROCESSES, Cluster, require_namespaces, wait_for
from helpers.receivers import Run


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


@pytest.fixture
def run_against(tmp_path):
    runs = []

    def make(receiver, native_modes):
        r = Run(tmp_path, receiver, native_modes)
        runs.append(r)
        r.start()
        return r
    yield make
    for r in runs:
        r.close()
