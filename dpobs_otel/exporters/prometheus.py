"""The Prometheus exporter: a reader on its own registry, the per-process /metrics route on
our HTTP(S) server (exporters/http.py) in the text exposition or, when the scraper's Accept
header prefers it, the delimited protobuf one with the native histograms (exporters/native_histograms.py),
and its file_sd announcement."""
from __future__ import annotations

import gzip
import os
import threading
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from .. import names
from . import protobuf
from .http import Handler, HttpServer, PortInUseError, only_get

__all__ = ["PortInUseError", "PrometheusExporter"]


class PrometheusExporter:
    """The default exporter: a PrometheusMetricReader on a registry of this process's own,
    served on /metrics, and (with sd_dir) a file_sd target file announcing it. Other routes
    (e.g. /trace) join the same server through add_route."""

    def __init__(self, settings):
        from .filesd import FileSDTarget
        from .native_histograms import NativeReader

        s = settings
        # A registry of its own, without scope labels (otel_sdk.prometheus_reader).
        self.reader, self.registry = NativeReader.on(CollectorRegistry(auto_describe=True))
        # One render at a time: a collect refreshes the reader's native stash, and the
        # protobuf render reads it right after its own collect.
        self._render_lock = threading.Lock()
        self._server = HttpServer(s.host, s.port, certfile=s.tls_certfile, keyfile=s.tls_keyfile,
                                  client_cafile=s.tls_client_cafile)
        self._server.add_route("/metrics", self._metrics)
        self._sd = None
        # (component, exception) of what failed here off the ops' way: Telemetry counts them.
        self.startup_errors: list[tuple[str, BaseException]] = []
        if s.sd_dir:
            try:
                self._sd = FileSDTarget(
                    s.sd_dir, f"{s.target_host}:{self._server.port}",
                    {"job": s.job, "role": s.role, "rank": s.rank},
                    name=f"dpobs-{s.job}-{s.role}-{s.rank}-{os.getpid()}")
            except Exception as exc:  # the endpoint still serves; only discovery is lost
                self.startup_errors.append((names.COMPONENT_FILE_SD, exc))
            except BaseException:
                self._server.close()
                raise

    def add_route(self, path: str, handler: Handler) -> None:
        """Serve handler(environ) -> (status, headers, body) at path, same bind and TLS."""
        self._server.add_route(path, handler)

    def _metrics(self, environ):
        refused = only_get(environ)
        if refused is not None:
            return refused
        wanted = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
        if protobuf.wants_protobuf(environ.get("HTTP_ACCEPT")):
            return self._encoded(environ, self.render_protobuf(wanted), protobuf.CONTENT_TYPE)
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT"))
        registry = self.registry.restricted_registry(wanted) if wanted else self.registry
        with self._render_lock:
            return self._encoded(environ, encoder(registry), content_type)

    def render_protobuf(self, wanted: list[str] | None = None) -> bytes:
        """Every family of the text exposition, then the native histograms; name[] keeps
        the samples (native: the families) of those names, as in the text exposition. The
        collect (restricted or not) refreshes the reader's native stash first."""
        registry = self.registry.restricted_registry(wanted) if wanted else self.registry
        with self._render_lock:
            classic = protobuf.from_prometheus_client(registry.collect())
            return classic + self.reader.native_families(wanted)

    @staticmethod
    def _encoded(environ, body: bytes, content_type: str):
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING")):
            body = gzip.compress(body, compresslevel=1)  # CPU matters more than bytes on loopback
            headers.append(("Content-Encoding", "gzip"))
        return "200 OK", headers, body

    @property
    def endpoint(self) -> str:
        return self._server.endpoint

    @property
    def url(self) -> str:
        return f"{self._server.scheme}://{self.endpoint}/metrics"

    def shutdown(self) -> None:
        if self._sd is not None:
            self._sd.remove()
        self._server.close()
