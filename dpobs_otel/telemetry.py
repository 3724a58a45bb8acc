"""One Telemetry per process: its own MeterProvider, Views, Prometheus registry and endpoint."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from time import perf_counter

from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from . import instruments, labels, names, observed
from .config import TLS, Settings, Unmeasured, debugging, disabled, say
from .critical import CriticalPath, Exposure
from .exposed import exposed_iterable
from .exporters.http import PortInUseError
from .facade import DisabledTelemetry, TelemetryInterface
from .shims.otel_histogram import OpRecords
from .shims.otel_sdk import degradations, op_duration_aggregation
from .stats import Stats
from .stepmetrics import StepMetrics
from .version import __version__

log = logging.getLogger("dpobs_otel")
# (pid, component) already logged: one line per component per process, however many
# Telemetries it makes; a forked child logs its own.
_LOGGED: set[tuple[int, str]] = set()


def _views() -> list[View]:
    def hist(name, bounds):
        return View(instrument_name=name,
                    aggregation=ExplicitBucketHistogramAggregation(boundaries=bounds))
    from .exporters import native_histograms  # classic buckets, and native ones beside them
    return [View(instrument_name=names.OP_DURATION, aggregation=op_duration_aggregation(
                 names.OP_BUCKETS, native_histograms.SCALE, native_histograms.with_native)),
            hist(names.CODEC_DURATION, names.OP_BUCKETS),
            hist(names.STEP_DURATION, names.STEP_BUCKETS),
            hist(names.ROW_AGE, names.OP_BUCKETS),
            hist(names.WEIGHTS_SYNC_DURATION, names.WEIGHT_SYNC_BUCKETS),
            hist(names.RAY_SERIALIZATION, names.OP_BUCKETS),
            hist(names.RAY_FETCH, names.OP_BUCKETS)]


class Telemetry(TelemetryInterface):
    enabled = True

    def __init__(self, settings: Settings, exporters=None, sources=None):
        self.settings = s = settings
        self.stats = Stats()
        self.critical = CriticalPath()
        if exporters is None:
            from .exporters.prometheus import PrometheusExporter
            exporters = [PrometheusExporter(s)]
        self.exporters = list(exporters)
        resource = Resource.create({"service.name": s.job, "dpobs.role": s.role,
                                    "dpobs.rank": str(s.rank)})
        self._provider = MeterProvider(metric_readers=[e.reader for e in self.exporters],
                                       views=_views(), resource=resource,
                                       exemplar_filter=AlwaysOffExemplarFilter())
        self.meter = meter = self._provider.get_meter("dpobs_otel", __version__)
        for e in self.exporters:  # the SDK's cardinality limit, never met silently
            watch = getattr(e.reader, "watch", None)
            if watch is not None:
                watch(self._collected)
        self._create_instruments(meter)
        if degradations():  # otel_sdk logged each; counted in this process's registry
            self.stats.instr_errors[names.OTEL_SDK_COMPONENT] = len(degradations())
        for e in self.exporters:  # what an exporter could not do at start (file_sd), counted
            for component, exc in getattr(e, "startup_errors", ()):
                self._startup_error(component, exc, sources or {})
        self.guard = None
        if s.verify_tensor_hash:
            from .guard import WireGuard  # off by default: no digest code runs without it
            self.guard = WireGuard(meter, self.internal_error)
        self.row_age = None
        if s.row_age:
            from .rowage import RowAge  # off by default: rows carry no stamp without it
            self.row_age = RowAge(meter, self)
        from .weights import Weights
        self.weights = Weights(self)
        self._step_metrics = StepMetrics(self.stats, self.critical, self.guard, self.row_age,
                                         self.weights)
        self.tracer = self._otlp = None
        if s.trace:  # off by default: nothing of tracing/ is imported without it
            from .tracing import attach
            self.tracer, self._otlp = attach(self)
        self._cluster_views: dict = {}  # source -> cluster.ClusterView
        self._closed = False

    # -- instruments ------------------------------------------------------------------
    def _create_instruments(self, meter) -> None:
        self.op_duration = instruments.create(meter, names.OP_DURATION)
        self.step_duration = instruments.create(meter, names.STEP_DURATION)
        self.codec_duration = instruments.create(meter, names.CODEC_DURATION)
        on_error = instruments.exported(self.internal_error)
        for name, observe in observed.core(self.stats, self.critical).items():
            instruments.create(meter, name, observe, on_error)
        self.op_attrs = {op: {"op": op} for op in names.OPS.values()}
        self.op_records = OpRecords(self.op_duration, self.op_attrs, self.internal_error)

    # -- public API -------------------------------------------------------------------
    @property
    def endpoint(self) -> str | None:
        """"host:port" of the first exporter that serves one (None: push exporters only)."""
        return next((e.endpoint for e in self.exporters if e.endpoint), None)

    @property
    def url(self) -> str | None:
        return next((e.url for e in self.exporters if getattr(e, "endpoint", None)), None)

    @property
    def registry(self):
        """The Prometheus exporter's registry (None without one)."""
        return next((e.registry for e in self.exporters if hasattr(e, "registry")), None)

    def instrument(self, inner):
        from .client import InstrumentedClient
        return InstrumentedClient(inner, self)

    @contextlib.contextmanager
    def step(self):
        """`with tel.step():` one training step (the denominator of frac_of_step). In a
        coroutine the step belongs to the task that entered it."""
        t0 = perf_counter()
        opened = self._begin("step", self.critical.step_begin, t0)
        traced = None if self.tracer is None else self._begin("trace", self.tracer.step_begin)
        try:
            yield
        finally:
            t1 = perf_counter()
            try:
                if opened is not None:
                    self.critical.step_end(opened, t1)
                self._step_done(t1 - t0)
            except Exception as exc:  # the user's block ran; only our bookkeeping failed
                self.internal_error("step", exc)
            if traced is not None:
                self._begin("trace", self.tracer.step_end, traced, t0, t1)

    def _begin(self, component: str, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:
            self.internal_error(component, exc)
            return None

    def waiting(self):
        """`with tel.waiting():` the step's own thread (or task) blocks on data-plane work
        done elsewhere (a prefetch queue, futures): exposed time. Outside a step, or on
        another thread, it counts nothing."""
        return self._waiting("waiting")

    def exposed(self, iterable):
        """`for batch in tel.exposed(loader):` the time next() (or __anext__) takes is
        exposed time; the batches pass through unchanged."""
        return exposed_iterable(iterable, lambda: self._waiting("exposed"))

    def _waiting(self, kind: str):
        exposure = self._begin("step", self.critical.exposure)
        if exposure is None:
            return contextlib.nullcontext()
        if self.tracer is not None and isinstance(exposure, Exposure):
            return self.tracer.waiting(exposure, kind)  # a span for the waits that count
        return exposure

    def codec(self, stage: str):
        """`with tel.codec("pack"):` codec work done outside the client."""
        if stage not in names.CODEC_STAGES:
            raise ValueError(f"codec stage must be one of {names.CODEC_STAGES}, got {stage!r}")
        return self._timed("codec", lambda dt: self._codec_done(stage, dt))

    @contextlib.contextmanager
    def _timed(self, component: str, done):
        t0 = perf_counter()
        try:
            yield
        finally:
            try:
                done(perf_counter() - t0)
            except Exception as exc:  # the user's block ran; only our bookkeeping failed
                self.internal_error(component, exc)

    def _step_done(self, dt: float) -> None:
        self.step_duration.record(dt)
        with self.stats.lock:
            self.stats.step_seconds += dt
            self.stats.steps += 1

    def _codec_done(self, stage: str, dt: float) -> None:
        self.codec_duration.record(dt, {"stage": stage})
        with self.stats.lock:
            cs = self.stats.codec_seconds
            cs[stage] = cs.get(stage, 0.0) + dt

    def step_metrics(self) -> dict[str, float]:
        try:
            return self._step_metrics.collect()
        except Exception as exc:
            self.internal_error("step_metrics", exc)
            return {}

    def cluster_step_metrics(self, source, *, job: str | None = None,
                             timeout: float = 1.0) -> dict[str, float]:
        """step_metrics() for every process under dpobs/cluster/, differenced against the
        previous call with the same source: a file_sd directory (every listed endpoint
        scraped now, https when this process serves TLS) or a Prometheus URL. job: only
        that job's processes (default this process's job). Never raises (readback/cluster.py
        says what each key means and which process counts what)."""
        try:
            view = self._cluster_views.get(source)
            if view is None:
                from .readback.cluster import ClusterView, tls_context_for
                view = self._cluster_views[source] = ClusterView(
                    source, job or self.settings.job, timeout, tls_context_for(self.settings))
            return view.step_metrics()
        except Exception as exc:
            self.internal_error("cluster", exc)
            return {}

    def cluster_breakdown(self, source) -> tuple[list[str], list[list]]:
        """(columns, rows) per op of the last cluster_step_metrics(source) window, worst
        first (cluster.breakdown): wandb.Table(columns=columns, data=rows)."""
        try:
            from .readback.cluster import COLUMNS
            view = self._cluster_views.get(source)
            return view.breakdown() if view is not None else (list(COLUMNS), [])
        except Exception as exc:
            self.internal_error("cluster", exc)
            return [], []

    def _startup_error(self, component: str, exc: BaseException, sources) -> None:
        """Counted like any internal error; a file_sd directory that cannot be written is
        the setting's fault, said in one line naming it (no traceback unless DPOBS_DEBUG)."""
        if component != names.COMPONENT_FILE_SD:
            return self.internal_error(component, exc)
        _LOGGED.add((os.getpid(), component))  # said here, in the setting's words
        self.internal_error(component, exc)
        where = sources.get("sd_dir", "sd_dir")
        say(f"dpobs: {where}={self.settings.sd_dir!r} cannot be written ({_brief(exc)}); "
            f"no file_sd target, so Prometheus must find {self.endpoint} another way "
            f"(counted in {names.INSTR_ERRORS_SERIES})", exc)

    def internal_error(self, component: str, exc: BaseException) -> None:
        """Count and log (once per component) an error of dpobs itself; never raises."""
        try:
            with self.stats.lock:
                ie = self.stats.instr_errors
                ie[component] = ie.get(component, 0) + 1
            key = (os.getpid(), component)
            if key not in _LOGGED:
                _LOGGED.add(key)
                log.warning("dpobs: internal error in %s, swallowed and counted in %s "
                            "(logged once): %r", component, names.INSTR_ERRORS_SERIES, exc,
                            exc_info=exc)
        except Exception:  # pragma: no cover - the last line of defence
            pass

    def _collected(self, metrics_data) -> None:
        """After a reader's collection: each instrument whose label sets reached the SDK's
        cardinality limit (its overflow point present) counts once more under component
        overflow, at every collection that has it, so the count keeps rising while series are
        folded; logged once per process. Never raises into the scrape."""
        try:
            folded = labels.overflowed(metrics_data)
            if not folded:
                return
            with self.stats.lock:
                ie = self.stats.instr_errors
                ie[names.COMPONENT_OVERFLOW] = ie.get(names.COMPONENT_OVERFLOW, 0) + len(folded)
            key = (os.getpid(), names.COMPONENT_OVERFLOW)
            if key not in _LOGGED:
                _LOGGED.add(key)
                log.warning("dpobs: %s reached the OpenTelemetry SDK's cardinality limit: label "
                            "sets past it are folded into one otel_metric_overflow=\"true\" "
                            "series, and queries over them undercount; counted in %s{component="
                            "\"%s\"} (logged once; docs/development/scaling.md)",
                            ", ".join(sorted(folded)), names.INSTR_ERRORS_SERIES,
                            names.COMPONENT_OVERFLOW)
        except Exception as exc:
            self.internal_error(names.COMPONENT_EXPORT, exc)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._otlp is not None:
            self._begin("trace", self._otlp.shutdown)  # the spans still queued go out first
        for e in self.exporters:
            e.shutdown()
        self._provider.shutdown()  # also unregisters the readers' collectors


def start(role: str | None = None, rank: int | None = None, *, job: str | None = None,
          host: str | None = None, port: int | None = None, sd_dir: str | None = None,
          verify_tensor_hash: bool | None = None, advertise_host: str | None = None,
          tls_certfile: str | None = None, tls_keyfile: str | None = None,
          tls_client_cafile: str | None = None, reconcile_rows: int | None = None,
          row_age: bool | None = None, trace: bool | None = None,
          trace_ring: int | None = None, trace_every: int | None = None,
          node: str | None = None, tq_metrics: bool | None = None,
          weights_in_band: bool | None = None, exporters=None) -> "Telemetry | DisabledTelemetry":
    """Start dpobs in this process and return its Telemetry.

    Every argument left None comes from its DPOBS_<NAME> environment variable, then the
    default (docs/reference/settings.md); rank falls back to RANK (torchrun), then
    SLURM_PROCID. A wrong argument raises ValueError naming it; a wrong variable never
    raises: one line on stderr names it and what dpobs does instead (its default, a free
    port, or running unmeasured: then the result measures nothing, like the off switch's). advertise_host: the host in
    file_sd when host is a wildcard. tls_*: serve /metrics over TLS, mutual with
    tls_client_cafile. reconcile_rows: rows put between occupancy reconciliations. row_age:
    rows carry their write time, reads observe their age (rowage.py). trace: spans of ops,
    steps and waits at /trace; trace_ring: spans kept; trace_every: trace one step in this
    many; node: the spans' node (default the host name); docs/guides/timeline.md. tq_metrics: a
    measured transfer_queue.init() turns TransferQueue's own exporter on where the config
    leaves it unset, and announces it for file_sd (docs/guides/transferqueue.md).
    weights_in_band: the weight proof's fingerprints travel in the weight stream, for
    transports whose processes share no control store (docs/guides/weights.md). exporters: in
    place of the Prometheus exporter (dpobs_otel.exporters). OTEL_SDK_DISABLED=true or
    DPOBS_DISABLED=1 turns dpobs off: the result instruments nothing and serves nothing."""
    debugging()  # read first: a malformed DPOBS_DEBUG is said even when all else is well
    if disabled():
        return DisabledTelemetry()
    try:
        settings, sources = Settings.resolve_sourced(
            role=role, rank=rank, job=job, host=host, port=port, sd_dir=sd_dir,
            verify_tensor_hash=verify_tensor_hash, advertise_host=advertise_host,
            tls_certfile=tls_certfile, tls_keyfile=tls_keyfile,
            tls_client_cafile=tls_client_cafile, reconcile_rows=reconcile_rows,
            row_age=row_age, trace=trace, trace_ring=trace_ring, trace_every=trace_every,
            node=node, tq_metrics=tq_metrics, weights_in_band=weights_in_band)
        return _serving(settings, sources, exporters)
    except Unmeasured as exc:
        say(str(exc), exc)
        return DisabledTelemetry()


def _serving(settings: Settings, sources: dict[str, str], exporters) -> "Telemetry":
    """Telemetry(settings), or what the environment's settings leave possible: a port in use
    that DPOBS_PORT named gives way to any free port; a bind or TLS setting from the
    environment that fails leaves the process unmeasured (Unmeasured). An argument in code
    that fails raises as it is."""
    try:
        return Telemetry(settings, exporters, sources)
    except PortInUseError as exc:
        if "port" not in sources:
            raise
        say(f"dpobs: {sources['port']}={settings.port} is already in use; serving on any "
            "free port instead", exc)
        return Telemetry(dataclasses.replace(settings, port=0), exporters, sources)
    except OSError as exc:  # ssl.SSLError is one: a certificate or key that does not load
        named = [f"{sources[n]}={os.environ.get(sources[n])!r}" for n in ("host", *TLS)
                 if n in sources]
        if not named:
            raise
        raise Unmeasured(f"dpobs: cannot serve /metrics with {', '.join(named)} "
                         f"({_brief(exc)}); dpobs runs unmeasured") from exc


def _brief(exc: BaseException) -> str:
    """An exception in a few words, for a line that names the setting."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:160]
