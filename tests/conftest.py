"""Shared fixtures: a fresh Telemetry per test (own registry, own port) and a scraper that
reads the real HTTP endpoint through prometheus_client's own parser."""
from __future__ import annotations

import os
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import dpobs_otel as dpobs

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")

# Ray, in any test that starts or joins it, stays on loopback with no usage stats (see
# dpobs_otel/adapters/tq_local.py); set here because test modules import ray before the harness.
os.environ.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})


def network_isolation() -> str | None:
    """None when this process's network namespace has only loopback, and it is up; else why
    not (tests/test_network.py; `make test` creates the namespace)."""
    names = [name for _, name in socket.if_nameindex()]
    if names != ["lo"]:
        return "interfaces besides lo: " + ", ".join(n for n in names if n != "lo")
    try:
        with open("/sys/class/net/lo/flags") as f:
            up = int(f.read(), 16) & 0x1  # IFF_UP
    except OSError as exc:
        return f"cannot read lo's flags: {exc}"
    return None if up else "lo is down"


def pytest_report_header(config):
    reason = network_isolation()
    return ("network: loopback-only namespace" if reason is None
            else f"network: NOT isolated ({reason})")


def scrape(tel) -> dict[tuple[str, frozenset], float]:
    """{(sample name, frozenset(labels)): value} from one GET of tel's /metrics."""
    text = urllib.request.urlopen(f"http://{tel.endpoint}/metrics", timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples, name, **labels) -> float | None:
    """The sample with exactly these labels, or None when the series is absent: so that
    `value(...) == 0` holds only for a series exported at 0, never for a missing one."""
    return samples.get((name, frozenset((k, str(v)) for k, v in labels.items())))


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
