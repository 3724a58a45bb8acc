"""OTLP out: when the variables ask for it (and only then), the spans reach an OTLP/HTTP
receiver run by the test, decoded with opentelemetry-proto, with their attributes, their
resource and the caller's durations."""
from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from time import perf_counter

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)

import dpobs_otel as dpobs
from dpobs_otel.tracing import otlp

ENV = ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
       "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
       "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "DPOBS_TRACE", "DPOBS_NODE")


@pytest.fixture
def clean_env(monkeypatch):
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.fixture
def receiver():
    got: list[ExportTraceServiceRequest] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            got.append((self.path, req))
            out = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", got
    server.shutdown()
    server.server_close()


def _value(v):
    return getattr(v, v.WhichOneof("value"))


def _spans(got):
    out = []
    for _, req in got:
        for rs in req.resource_spans:
            res = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                out += [(res, s) for s in ss.spans]
    return out


@pytest.mark.parametrize("env, on", [
    ({}, False),  # the specification's default exporter is otlp: unset must not mean export
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "console,otlp"}, True),
])
def test_otlp_is_on_only_when_asked_explicitly(env, on):
    assert otlp.wanted(env) is on


def test_grpc_without_its_package_and_unknown_protocols_are_clear_errors():
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    try:
        import opentelemetry.exporter.otlp.proto.grpc  # noqa: F401
        pytest.skip("the grpc exporter is installed here")  # the http one is what ships
    except ImportError:
        pass
    with pytest.raises(otlp.OTLPConfigError, match="opentelemetry-exporter-otlp-proto-grpc"):
        otlp.span_exporter(env)
    with pytest.raises(otlp.OTLPConfigError, match="http/json"):
        otlp.span_exporter({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"})


def test_the_variables_alone_do_not_turn_tracing_on(clean_env, receiver):
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver[0])
    tel = dpobs.start(role="t", rank=0, port=0)
    try:
        assert tel.tracer is None
    finally:
        tel.shutdown()


def test_spans_reach_an_otlp_http_receiver_with_their_attributes(clean_env, receiver):
    url, got = receiver
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", url)
    clean_env.setenv("DPOBS_NODE", "node-a")
    tel = dpobs.start(role="trainer", rank=3, job="jobx", port=0, trace=True)
    client = tel.instrument(dpobs.InMemoryDataPlane())
    client.register_partition("p")
    made = []
    with tel.step():
        t0 = perf_counter()
        client.list_sample_ids("p")
        made.append(perf_counter() - t0)
        with pytest.raises(KeyError):
            client.get_samples(["nope"], "missing")
    tel.shutdown()  # flushes what is queued
    spans = _spans(got)
    assert got and all(path == "/v1/traces" for path, _ in got)
    res = spans[0][0]
    assert (res["service.name"], res["dpobs.role"], res["dpobs.rank"], res["dpobs.node"]) == (
        "jobx", "trainer", "3", "node-a")
    by_name = {s.name: {a.key: _value(a.value) for a in s.attributes} for _, s in spans}
    assert set(by_name) == {"dpobs.register", "dpobs.list", "dpobs.get", "dpobs.step"}
    assert by_name["dpobs.list"]["partition"] == "p" and by_name["dpobs.list"]["step"] == 1
    assert by_name["dpobs.get"]["error.type"] == "KeyError"
    assert by_name["dpobs.step"]["step"] == 1
    listed = next(s for _, s in spans if s.name == "dpobs.list")
    assert 0 < (listed.end_time_unix_nano - listed.start_time_unix_nano) / 1e9 <= made[0]
