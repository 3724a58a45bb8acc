"""The per-process /metrics HTTP(S) endpoint, on prometheus_client's server."""
from __future__ import annotations

import errno

from prometheus_client import CollectorRegistry, start_http_server


class PortInUseError(OSError):
    pass


class MetricsEndpoint:
    def __init__(self, registry: CollectorRegistry, host: str, port: int, *,
                 certfile: str | None = None, keyfile: str | None = None,
                 client_cafile: str | None = None):
        try:
            self._server, self._thread = start_http_server(
                port, addr=host, registry=registry, certfile=certfile, keyfile=keyfile,
                client_cafile=client_cafile, client_auth_required=client_cafile is not None)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(
                    errno.EADDRINUSE,
                    f"dpobs: cannot serve /metrics on {host}:{port}: port {port} is already in "
                    f"use (pass port=0 or DPOBS_PORT=0 for any free port)") from exc
            raise
        self.host = host
        self.port = self._server.server_address[1]
        self.scheme = "https" if certfile else "http"

    @property
    def endpoint(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
