"""pytest fixtures and series names shared by the TransferQueue test modules (import the
fixtures by name into a module: `from tq_fixtures import cluster, make_tel`)."""
from __future__ import annotations

import pytest
from dpobs_otel.adapters.tq_local import start, stop

import dpobs_otel as dpobs

OPS = "dpobs_client_operation_duration_seconds_count"
BYTES = "dpobs_client_transferred_bytes_total"
KEYS = "dpobs_client_keys_total"
MISSING = "dpobs_client_rows_missing_total"
ERRORS = "dpobs_client_operation_errors_total"
T = 60  # seconds: the timeout of one TransferQueue call


@pytest.fixture(scope="module")
def cluster():
    """Ray + TransferQueue for one test module (~15 s to start), stopped at its end."""
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
