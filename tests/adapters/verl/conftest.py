"""Fixtures of the verl adapter's in-process tests: a Telemetry with the guard on and the
instrumentor measuring into it, taken off again after each test. One process has no store
joining its two sides, so the proof rides in band here (through verl's own chunking);
test_verl_gloo.py runs the default, out of band, between processes. The test modules skip
themselves when verl is not installed (the suite installs it: Makefile, VERL_IMPORT); this
file imports verl only inside the fixtures, which run after that skip."""
from __future__ import annotations

import pytest

import dpobs_otel as dpobs


@pytest.fixture
def proving(monkeypatch):
    for var in ("DPOBS_ROLE", "DPOBS_RANK", "DPOBS_PORT", "DPOBS_HOST", "DPOBS_SD_DIR",
                "DPOBS_VERIFY_TENSOR_HASH", "DPOBS_WEIGHTS_IN_BAND", "DPOBS_JOB", "DPOBS_DISABLED",
                "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(var, raising=False)
    t = dpobs.start(role="test", rank=0, port=0, host="127.0.0.1", verify_tensor_hash=True,
                    weights_in_band=True)
    yield t
    t.shutdown()


@pytest.fixture
def instrumented(proving):
    from dpobs_otel.adapters.verl import VerlInstrumentor

    inst = VerlInstrumentor()
    inst.instrument(telemetry=proving)
    yield inst
    inst.uninstrument()
