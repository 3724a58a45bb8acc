"""A stand-in for Prometheus's instant-query API on loopback: a test says what each query
answers (`vector`), this serves it the way /api/v1/query does."""
from __future__ import annotations

import contextlib
import http.server
import json
import threading
import urllib.parse


class QueryAPI(http.server.BaseHTTPRequestHandler):
    """Subclass and define vector(query) -> the result list of an instant vector."""

    def vector(self, query: str) -> list[dict]:
        raise NotImplementedError

    def do_GET(self):
        q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
        body = json.dumps({"status": "success",
                           "data": {"resultType": "vector", "result": self.vector(q)}}).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@contextlib.contextmanager
def serving(handler: type[QueryAPI]):
    """The handler on a free loopback port, for the block: yields its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
