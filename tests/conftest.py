"""Shared fixtures: a fresh Telemetry per test (own registry, own port) and a scraper that
reads the real HTTP endpoint through prometheus_client's own parser."""
from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import dpobs_otel as dpobs


def scrape(tel) -> dict[tuple[str, frozenset], float]:
    """{(sample name, frozenset(labels)): value} from one GET of tel's /metrics."""
    text = urllib.request.urlopen(f"http://{tel.endpoint}/metrics", timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples, name, **labels) -> float:
    """The sample with exactly these labels (0.0 when absent, as a counter never incremented)."""
    return samples.get((name, frozenset((k, str(v)) for k, v in labels.items())), 0.0)


@pytest.fixture
def tel(monkeypatch):
    for var in ("DPOBS_ROLE", "DPOBS_RANK", "DPOBS_PORT", "DPOBS_HOST", "DPOBS_SD_DIR",
                "DPOBS_VERIFY_TENSOR_HASH", "DPOBS_JOB", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(var, raising=False)
    t = dpobs.start(role="test", rank=0, port=0)
    yield t
    t.shutdown()


@pytest.fixture
def client(tel):
    return tel.instrument(dpobs.InMemoryDataPlane())
