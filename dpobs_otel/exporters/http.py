"""The per-process HTTP(S) server: one small WSGI app of ours on a thread, serving the routes
added to it (/metrics in both expositions, later /trace) on one bind with one TLS setting.

prometheus_client's start_http_server has no hook for the Accept header nor for other paths,
hence our own. A route is `handler(environ) -> (status, headers, body)`; the server answers
404 to any other path and 500 (logged) when a handler raises, so a broken route never takes
the others down. TLS is handshaken in the request's own thread, so a slow or hostile client
cannot stall the accept loop, and every connection has a timeout.
"""
from __future__ import annotations

import errno
import logging
import socket
import ssl
import threading
from socketserver import ThreadingMixIn
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

log = logging.getLogger("dpobs_otel")

Response = tuple[str, list[tuple[str, str]], bytes]
Handler = Callable[[dict], Response]

# A connection that sends nothing for this long is dropped (a scrape is well under it).
CONNECTION_TIMEOUT_S = 30.0


class PortInUseError(OSError):
    pass


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # a scrape every 15 s is not news
        pass


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # never join request threads at close: a stuck client can't hang us
    ssl_context: ssl.SSLContext | None = None

    def finish_request(self, request, client_address):
        request.settimeout(CONNECTION_TIMEOUT_S)
        if self.ssl_context is not None:
            try:
                request = self.ssl_context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                return  # a failed handshake (no client certificate, plain http) is the client's
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address):
        log.debug("dpobs: /metrics connection from %s failed", client_address, exc_info=True)


def server_ssl_context(certfile: str, keyfile: str,
                       client_cafile: str | None = None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certfile=certfile, keyfile=keyfile)
    if client_cafile is not None:  # mutual TLS: a client certificate signed by this CA, or no
        ctx.load_verify_locations(cafile=client_cafile)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class HttpServer:
    """Serves `routes` on host:port (port 0: any free one) until close()."""

    def __init__(self, host: str, port: int, *, certfile: str | None = None,
                 keyfile: str | None = None, client_cafile: str | None = None):
        self._routes: dict[str, Handler] = {}
        server_cls = type("_BoundServer", (_Server,), {})
        server_cls.address_family, addr = _family(host, port)
        if certfile and keyfile:
            server_cls.ssl_context = server_ssl_context(certfile, keyfile, client_cafile)
        try:
            self._server = make_server(addr, port, self._app, server_cls,
                                       handler_class=_QuietHandler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(
                    errno.EADDRINUSE,
                    f"dpobs: cannot serve /metrics on {host}:{port}: port {port} is already in "
                    f"use (pass port=0 or DPOBS_PORT=0 for any free port)") from exc
            raise
        self.host = host
        self.port = self._server.server_address[1]
        self.scheme = "https" if server_cls.ssl_context is not None else "http"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="dpobs-http", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def add_route(self, path: str, handler: Handler) -> None:
        if not path.startswith("/"):
            raise ValueError(f"a route is an absolute path, not {path!r}")
        self._routes[path] = handler

    def _app(self, environ, start_response):
        handler = self._routes.get(environ.get("PATH_INFO", ""))
        if handler is None:
            status, headers, body = not_found()
        else:
            try:
                status, headers, body = handler(environ)
            except Exception:
                log.warning("dpobs: %s failed", environ.get("PATH_INFO"), exc_info=True)
                status, headers, body = plain("500 Internal Server Error", "internal error\n")
        start_response(status, headers + [("Content-Length", str(len(body)))])
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def plain(status: str, text: str) -> Response:
    return status, [("Content-Type", "text/plain; charset=utf-8")], text.encode()


def not_found() -> Response:
    return plain("404 Not Found", "not found\n")


def only_get(environ) -> Response | None:
    """The 405 answer to a method other than GET/HEAD, or None to go on."""
    if environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
        return None
    status, headers, body = plain("405 Method Not Allowed", "use GET\n")
    return status, headers + [("Allow", "GET, HEAD")], body


def _family(host: str, port: int):
    """(address family, address) for host: IPv6 hosts need AF_INET6 on the server class."""
    info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = info[0]
    return family, sockaddr[0]
