"""Telemetries for the weight-sync tests: one per side, the guard on (the proof) unless a
test asks otherwise."""
from __future__ import annotations

import pytest

import dpobs_otel as dpobs


@pytest.fixture
def proving():
    made = []

    def start(role="trainer", guard=True, **kw):
        t = dpobs.start(role=role, rank=len(made), port=0, verify_tensor_hash=guard, **kw)
        made.append(t)
        return t

    yield start
    for t in made:
        t.shutdown()
