"""How series leave a process: the seam every exporter plugs into.

Telemetry hands each exporter's `reader` (an OpenTelemetry MetricReader) to its one
MeterProvider and calls `shutdown()` on the way out. The default is the Prometheus
exporter (a /metrics endpoint, optionally announced through file_sd); a push exporter is
any object with the same two members, e.g. an OTLP exporter:

    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    class Otlp:
        endpoint = None
        def __init__(self, exporter): self.reader = PeriodicExportingMetricReader(exporter)
        def shutdown(self): pass          # the provider shuts the reader down
    tel = dpobs.start(role="trainer", exporters=[Otlp(OTLPMetricExporter())])
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Exporter"]


@runtime_checkable
class Exporter(Protocol):
    reader: object  # opentelemetry.sdk.metrics.export.MetricReader
    endpoint: str | None  # "host:port" a scraper reaches, or None for a push exporter

    def shutdown(self) -> None: ...
