"""GET /trace: the process's ring as JSON, served by the /metrics app (same bind, same TLS).

`?steps=N` keeps the spans of the last N traced steps (tracer.last_steps). The handler has
the exporter's route signature: handler(environ) -> (status, headers, body)."""
from __future__ import annotations

import gzip
import json
from urllib.parse import parse_qs


def trace_handler(tracer, on_error=None):
    def handle(environ):
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            return _plain("405 Method Not Allowed", "GET /trace\n", [("Allow", "GET, HEAD")])
        query = parse_qs(environ.get("QUERY_STRING", ""))
        try:
            steps = int(query["steps"][0]) if "steps" in query else None
        except ValueError:
            return _plain("400 Bad Request", "steps must be an integer\n")
        try:
            body = json.dumps(tracer.snapshot(steps), separators=(",", ":")).encode()
        except Exception as exc:  # never let the ring's reader take the endpoint down
            if on_error is not None:
                on_error("trace", exc)
            return _plain("500 Internal Server Error", "trace unavailable\n")
        headers = [("Content-Type", "application/json")]
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
            body = gzip.compress(body, compresslevel=1)
            headers.append(("Content-Encoding", "gzip"))
        return "200 OK", headers, body
    return handle


def _plain(status: str, text: str, extra=()):
    return status, [("Content-Type", "text/plain; charset=utf-8"), *extra], text.encode()
