"""Our /metrics server: the text exposition byte for byte what prometheus_client writes, TLS and
mutual TLS, added routes on the same bind, and the answers to unknown paths, other methods
and a failing route."""
from __future__ import annotations

import gzip
import socket
import ssl
import subprocess
import urllib.error
import urllib.request

import pytest
import torch
from prometheus_client import generate_latest
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel.exporters.http import HttpServer, PortInUseError


def get(url, *, method="GET", headers=None, context=None):
    """(status, headers, body) of one request; HTTP errors are answers here, not failures."""
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_text_exposition_is_prometheus_clients(tel, client):
    client.put_samples(["a", "b"], "p", TensorDict({"x": torch.ones(2, 3)}, batch_size=[2]))
    client.get_samples(["a"], "p")
    exporter = tel.exporters[0]
    status, headers, body = get(tel.url)
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    # Observable callbacks run per collect, so compare two renders of the same state.
    assert body == generate_latest(exporter.registry)
    assert b"dpobs_client_operation_duration_seconds_bucket" in body
    status, headers, zipped = get(tel.url, headers={"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip" and gzip.decompress(zipped) == body
    _, headers, om = get(tel.url, headers={"Accept": "application/openmetrics-text"})
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert om.endswith(b"# EOF\n")


def test_added_route_is_served_and_unknown_paths_are_404(tel):
    seen = []

    def hello(environ):
        seen.append(environ["QUERY_STRING"])
        return "200 OK", [("Content-Type", "text/plain")], b"hello"
    tel.exporters[0].add_route("/trace", hello)
    base = f"http://{tel.endpoint}"
    assert get(f"{base}/trace?n=3")[::2] == (200, b"hello") and seen == ["n=3"]
    for path in ("/", "/metricsx", "/trace/1", "/favicon.ico"):
        assert get(base + path)[0] == 404, path
    assert get(tel.url)[0] == 200  # /metrics still there beside the new route


def test_methods_head_and_a_failing_route(tel):
    def broken(environ):
        raise RuntimeError("boom")
    tel.exporters[0].add_route("/broken", broken)
    status, headers, body = get(f"http://{tel.endpoint}/broken")
    assert status == 500 and b"boom" not in body  # no internals leak to a scraper
    status, headers, _ = get(tel.url, method="POST")
    assert status == 405 and "GET" in headers["Allow"]
    status, headers, body = get(tel.url, method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0
    assert get(tel.url)[0] == 200  # the failure took nothing else down
    with pytest.raises(ValueError):
        tel.exporters[0].add_route("trace", broken)


def test_port_in_use_is_a_port_in_use_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port {port} is already in use"):
            HttpServer("127.0.0.1", port)
    assert dpobs.PortInUseError is PortInUseError


def test_ipv6_loopback_bind():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this interpreter")
    try:
        server = HttpServer("::1", 0)
    except OSError as exc:
        pytest.skip(f"::1 not available here: {exc}")
    try:
        server.add_route("/x", lambda env: ("200 OK", [], b"v6"))
        assert server.endpoint == f"[::1]:{server.port}"
        assert get(f"http://{server.endpoint}/x")[2] == b"v6"
    finally:
        server.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")

    def make(name):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.crt")],
                       check=True, capture_output=True)
        return str(d / f"{name}.crt"), str(d / f"{name}.key")
    return {"server": make("server"), "client": make("client")}


def test_routes_share_mutual_tls(certs):
    crt, key = certs["server"]
    ccrt, ckey = certs["client"]
    tel = dpobs.start(role="mtls", port=0, tls_certfile=crt, tls_keyfile=key,
                      tls_client_cafile=ccrt)
    try:
        tel.exporters[0].add_route("/trace", lambda env: ("200 OK", [], b"t"))
        ctx = ssl.create_default_context(cafile=crt)
        with pytest.raises((ssl.SSLError, OSError)):  # no client certificate: no answer at all
            get(f"https://{tel.endpoint}/trace", context=ctx)
        with pytest.raises(OSError):  # plain http to the TLS port
            get(f"http://{tel.endpoint}/trace")
        ctx.load_cert_chain(ccrt, ckey)
        assert get(f"https://{tel.endpoint}/trace", context=ctx)[2] == b"t"
        assert b"target_info" in get(tel.url, context=ctx)[2]
    finally:
        tel.shutdown()


def test_a_client_that_never_handshakes_does_not_block_others(certs):
    crt, key = certs["server"]
    tel = dpobs.start(role="tls", port=0, tls_certfile=crt, tls_keyfile=key)
    host, port = tel.endpoint.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5):  # connects, says nothing
            ctx = ssl.create_default_context(cafile=crt)
            assert get(tel.url, context=ctx)[0] == 200
    finally:
        tel.shutdown()
