"""Tracing: spans of ops, steps and waits (DESIGN.md "Timeline (tracing)").

A traced process (start(trace=True) or DPOBS_TRACE=1) keeps its spans in a bounded ring
(tracer.py), serves it at /trace beside /metrics (route.py) and, when the OpenTelemetry
variables ask for it, sends them over OTLP (otlp.py). `dpobs timeline` (command.py) collects
every process's ring (collect.py) into a Chrome trace-event JSON (events.py) and a PNG
(picture.py). Nothing here is imported when tracing is off."""
from __future__ import annotations

import os

from .tracer import Tracer

# What the settings read (config.Settings: DPOBS_<NAME>), spelled here for the docs.
ENV = ("DPOBS_TRACE", "DPOBS_TRACE_RING", "DPOBS_TRACE_EVERY", "DPOBS_NODE")


def start(settings, env=os.environ) -> tuple[Tracer, object]:
    """The process's Tracer and its OTLP forwarder (None unless the variables ask for one);
    a bad OTLP configuration is said here, at start, in one line, and
    exports nothing."""
    s = settings
    resource = {"job": s.job, "role": s.role, "rank": s.rank, "node": s.node_name,
                "pid": os.getpid()}
    tracer = Tracer(s.trace_ring, s.trace_every, resource)
    from . import otlp
    forwarder = None
    if otlp.wanted(env):
        try:
            forwarder = otlp.OTLPForwarder(tracer, otlp.span_exporter(env))
        except otlp.OTLPConfigError as exc:  # the variables' fault: said, never raised
            from ..config import say
            say(f"{exc}; spans stay at /trace, none exported", exc)
    return tracer, forwarder


def attach(tel) -> tuple[Tracer, object]:
    """start() for a Telemetry: its resource gets the /metrics address, and /trace is served
    by every exporter that takes routes (same bind, same TLS as /metrics)."""
    from .route import trace_handler

    tracer, forwarder = start(tel.settings)
    if tel.endpoint:
        port = tel.endpoint.rsplit(":", 1)[1]
        tracer.resource["instance"] = f"{tel.settings.target_host}:{port}"
    for e in tel.exporters:
        if hasattr(e, "add_route"):
            e.add_route("/trace", trace_handler(tracer, tel.internal_error))
    return tracer, forwarder


__all__ = ["Tracer", "start", "attach", "ENV"]
