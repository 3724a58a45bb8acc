"""Spans out over OTLP, when the standard variables ask for it explicitly.

The specification's default for OTEL_TRACES_EXPORTER is "otlp", so an unset variable must not
mean "export" here: OTLP is on when OTEL_TRACES_EXPORTER names otlp, or (the variable unset)
when an OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set. Neither turns
tracing on by itself (trace=True / DPOBS_TRACE=1 does). The protocol is http/protobuf (the
extra `otlp`: opentelemetry-exporter-otlp-proto-http) unless OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL
says grpc (opentelemetry-exporter-otlp-proto-grpc); a missing package is a clear error.

The exporter reads the ring's records from a queue of its own on a background thread and
makes them OpenTelemetry SDK spans with their recorded start and end times (tracer.py says
why not on the hot path); the SDK's BatchSpanProcessor sends them."""
from __future__ import annotations

import logging
import os
import threading
from collections import deque

from .tracer import span, wall_clock

log = logging.getLogger("dpobs_otel")
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
# the traces' own first, as the OTel SDK reads them
PROTOCOL_VARS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
PACKAGES = {"http/protobuf": ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                              "opentelemetry-exporter-otlp-proto-http", "dpobs-otel[otlp]"),
            "grpc": ("opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
                     "opentelemetry-exporter-otlp-proto-grpc",
                     "opentelemetry-exporter-otlp-proto-grpc")}


class OTLPConfigError(RuntimeError):
    pass


def wanted(env=os.environ) -> bool:
    named = env.get("OTEL_TRACES_EXPORTER")
    if named is not None:
        return "otlp" in {v.strip().lower() for v in named.split(",")}
    return any(env.get(v) for v in ENDPOINT_VARS)


def protocol(env=os.environ) -> str:
    var = next((v for v in PROTOCOL_VARS if env.get(v)), None)
    proto = (env[var] if var else "http/protobuf").strip().lower()
    if proto not in PACKAGES:
        raise OTLPConfigError(f"dpobs: {var}={env[var]!r}: OTLP protocol {proto!r} is not "
                              f"supported for traces (use http/protobuf or grpc)")
    return proto


def span_exporter(env=os.environ):
    """The OTLP span exporter the variables ask for (it reads its endpoint, headers and
    timeouts from them itself)."""
    import importlib

    proto = protocol(env)
    module, package, extra = PACKAGES[proto]
    try:
        return importlib.import_module(module).OTLPSpanExporter()
    except ImportError as exc:
        var = next((v for v in PROTOCOL_VARS if env.get(v)), "OTEL_EXPORTER_OTLP_PROTOCOL")
        raise OTLPConfigError(f"dpobs: {var}={proto!r}: OTLP over {proto} needs {package}: "
                              f"pip install '{extra}'") from exc


class OTLPForwarder:
    """Drains the tracer's pending records into SDK spans every `interval` seconds."""

    def __init__(self, tracer, exporter, interval: float = 1.0, backlog: int = 65536):
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self._tracer = tracer
        self._provider = TracerProvider(resource=Resource.create(otel_resource(tracer)))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._sdk = self._provider.get_tracer("dpobs_otel")
        tracer.pending = deque(maxlen=backlog)  # bounded too: a dead receiver costs no memory
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, name="dpobs-otlp", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.drain()

    def drain(self) -> int:
        from opentelemetry import context

        pending, root, n = self._tracer.pending, context.Context(), 0
        to_wall = wall_clock()
        names = self._tracer.thread_names()
        while pending:
            s = span(pending.popleft(), to_wall)
            attrs = dict(s["attributes"], **{"thread.id": s["tid"],
                                             "thread.name": names.get(s["tid"], "")})
            sdk = self._sdk.start_span(s["name"], context=root, start_time=s["start_ns"],
                                       attributes=attrs)
            sdk.end(end_time=s["end_ns"])
            n += 1
        return n

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.drain()
            self._provider.force_flush(5000)
        finally:
            self._provider.shutdown()


def otel_resource(tracer) -> dict:
    r = tracer.resource
    out = {"service.name": r.get("job", "dpobs"), "host.name": r.get("node", "")}
    out.update({f"dpobs.{k}": str(v) for k, v in r.items()})
    return out
