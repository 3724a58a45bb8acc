"""readback/prometheus.py, the one client of Prometheus's HTTP API, against a stand-in server
on loopback: answers as floats with their timestamps, every failure one PrometheusError
(unreachable, an error reply with its reason, a body that is not JSON, a range answer to an
instant query), requests run on a given executor, and no other module of the package
speaks the query API."""
from __future__ import annotations

import ast
import http.server
import json
import re
import socket
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import dpobs_otel
from dpobs_otel.readback.prometheus import Prometheus, PrometheusError

PKG = Path(dpobs_otel.__file__).parent
ANSWERS = {  # query -> (HTTP status, body)
    "up": (200, {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"instance": "a:1"}, "value": [100.5, "1"]}]}}),
    "1+1": (200, {"status": "success", "data": {"resultType": "scalar",
                                                "result": [100.5, "2"]}}),
    "up[1m]": (200, {"status": "success", "data": {"resultType": "matrix", "result": []}}),
    "bad(": (400, {"status": "error", "errorType": "bad_data", "error": "parse error"}),
    "broken": (500, "<html>not json</html>"),
}


class Stand(http.server.BaseHTTPRequestHandler):
    """Answers /-/ready, and each query in ANSWERS as written there."""

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        if url.path == "/-/ready":
            status, body = 200, "ready"
        else:
            status, body = ANSWERS[urllib.parse.parse_qs(url.query)["query"][0]]
        self.send_response(status)
        self.end_headers()
        self.wfile.write((body if isinstance(body, str) else json.dumps(body)).encode())

    def log_message(self, *a):
        pass


@pytest.fixture
def url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stand)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_answers_are_floats_with_their_timestamps(url):
    prom = Prometheus(url + "/", timeout=5)
    assert prom.query("up") == [{"metric": {"instance": "a:1"}, "value": 1.0, "ts": 100.5}]
    assert prom.query("1+1") == [{"metric": {}, "value": 2.0, "ts": 100.5}]
    assert prom.ready()


def test_every_failure_is_one_error_type_that_says_why(url):
    prom = Prometheus(url, timeout=5)
    with pytest.raises(PrometheusError, match="bad_data: parse error"):
        prom.query("bad(")
    with pytest.raises(PrometheusError, match="HTTP 500"):
        prom.query("broken")
    with pytest.raises(PrometheusError, match="matrix, not a vector"):
        prom.query("up[1m]")
    gone = refused_url()
    with pytest.raises(PrometheusError, match="unreachable"):
        Prometheus(gone, timeout=1).query("up")
    assert not Prometheus(gone, timeout=1).ready()


def refused_url() -> str:
    """A URL nothing listens on (a port bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_requests_run_on_the_given_executor(url):
    with ThreadPoolExecutor(1, thread_name_prefix="elsewhere") as pool:
        names = []
        original = Prometheus._fetch

        def spy(self, full, path):
            names.append(threading.current_thread().name)
            return original(self, full, path)
        prom = Prometheus(url, executor=pool)
        prom._fetch = spy.__get__(prom)
        assert prom.query("up")[0]["value"] == 1.0
    assert names and all(n.startswith("elsewhere") for n in names)


def _code_strings(path: Path):
    """String constants of a module, its docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in docs]


def test_no_other_module_speaks_the_query_api():
    api = re.compile(r"/api/v1/(?!write\b)|/-/ready")  # remote write is the agents' target
    own = PKG / "readback" / "prometheus.py"
    speakers = [str(p.relative_to(PKG)) for p in sorted(PKG.rglob("*.py")) if p != own
                and any(api.search(s) for s in _code_strings(p))]
    # testing/stack.py waits for Alertmanager's /-/ready, not Prometheus's API
    assert speakers == ["testing/stack.py"], speakers
    classes = [n.name for p in PKG.rglob("*.py") for n in ast.walk(ast.parse(p.read_text()))
               if isinstance(n, ast.ClassDef)]
    assert classes.count("PrometheusError") == 1 and classes.count("PrometheusSource") == 1
