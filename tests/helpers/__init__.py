"""What tests share besides fixtures: reading a process's /metrics, telling CI apart, and
whether this network namespace has only loopback. Fixtures live in the conftest.py of each
folder; this package is on the path through pytest's `pythonpath` setting."""
from __future__ import annotations

import os
import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


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
    `value(...) == 0` holds only for a series exported at 0, never for a missing one. A label
    written empty is absent, as Prometheus reads it: the exporter writes a label some series
    of a family carry (Ray's ops' `method`) on every other series of it, empty."""
    want = frozenset((k, str(v)) for k, v in labels.items())
    if (name, want) in samples:
        return samples[(name, want)]
    hits = [v for (n, have), v in samples.items()
            if n == name and frozenset((k, x) for k, x in have if x != "") == want]
    return hits[0] if len(hits) == 1 else None
