"""The Prometheus exporter: a reader on its own registry, the per-process /metrics HTTP(S)
endpoint (prometheus_client's server), and its file_sd announcement."""
from __future__ import annotations

import errno
import os

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


class PrometheusExporter:
    """The default exporter: a PrometheusMetricReader on a registry of this process's own,
    served on /metrics, and (with sd_dir) a file_sd target file announcing it."""

    def __init__(self, settings):
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        from .filesd import FileSDTarget

        s = settings
        self.registry = CollectorRegistry(auto_describe=True)
        # scope labels would ride on every series without telling anyone anything.
        self.reader = PrometheusMetricReader(registry=self.registry, scope_info_enabled=False)
        self._endpoint = MetricsEndpoint(self.registry, s.host, s.port, certfile=s.tls_certfile,
                                         keyfile=s.tls_keyfile,
                                         client_cafile=s.tls_client_cafile)
        self._sd = None
        if s.sd_dir:
            try:
                self._sd = FileSDTarget(
                    s.sd_dir, f"{s.target_host}:{self._endpoint.port}",
                    {"job": s.job, "role": s.role, "rank": s.rank},
                    name=f"dpobs-{s.job}-{s.role}-{s.rank}-{os.getpid()}")
            except BaseException:
                self._endpoint.close()
                raise

    @property
    def endpoint(self) -> str:
        return self._endpoint.endpoint

    @property
    def url(self) -> str:
        return f"{self._endpoint.scheme}://{self.endpoint}/metrics"

    def shutdown(self) -> None:
        if self._sd is not None:
            self._sd.remove()
        self._endpoint.close()
