"""Fixtures of the guard tests."""
from __future__ import annotations

import pytest

import dpobs_otel as dpobs


@pytest.fixture
def guarded(monkeypatch):
    monkeypatch.delenv("DPOBS_VERIFY_TENSOR_HASH", raising=False)
    tel = dpobs.start(role="guard-test", rank=0, port=0, verify_tensor_hash=True)
    store = dpobs.InMemoryDataPlane()
    yield tel, tel.instrument(store), store
    tel.shutdown()
