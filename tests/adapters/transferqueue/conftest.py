"""Fixtures of the live TransferQueue tests: Ray and TransferQueue once per test module, and
fresh Telemetries per test."""
from __future__ import annotations

import pytest

import dpobs_otel as dpobs
from dpobs_otel.testing.transferqueue import start, stop


@pytest.fixture(scope="module")
def cluster():
    """Ray + TransferQueue for one test module, stopped at its end."""
    handle = start()  # stops what it started if it fails half way
    try:
        yield handle
    finally:
        stop()  # tq.close() (this process started it) + ray.shutdown()


@pytest.fixture
def make_tel(monkeypatch):
    """make(guard) -> a fresh Telemetry (own registry, own port), shut down after the test."""
    for var in ("DPOBS_ROLE", "DPOBS_RANK", "DPOBS_PORT", "DPOBS_HOST", "DPOBS_SD_DIR",
                "DPOBS_VERIFY_TENSOR_HASH", "DPOBS_JOB"):
        monkeypatch.delenv(var, raising=False)
    made = []

    def make(guard: bool):
        t = dpobs.start(role="test", rank=0, port=0, verify_tensor_hash=guard)
        made.append(t)
        return t

    yield make
    for t in made:
        t.shutdown()
