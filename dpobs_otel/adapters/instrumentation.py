"""What dpobs's OpenTelemetry-style instrumentors share (transferqueue_instrumentor,
mooncake_instrumentor): the BaseInstrumentor they derive from, made thread-safe, and the
per-process adapter that the first measured call in each process builds.

opentelemetry-instrumentation is optional: DPOBS_AUTO=1 needs no OpenTelemetry launcher, so
without the package a small stand-in with the same contract is used.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable

try:
    from opentelemetry.instrumentation.instrumentor import BaseInstrumentor as _Base
except ImportError:
    class _Base:
        """The part of opentelemetry-instrumentation's BaseInstrumentor used here: one
        instance per class, instrument() and uninstrument() each at most once in a row."""

        _instance = None
        _is_instrumented_by_opentelemetry = False

        def __new__(cls, *args, **kwargs):
            if cls._instance is None:
                cls._instance = object.__new__(cls)
            return cls._instance

        def instrument(self, **kwargs):
            if self._is_instrumented_by_opentelemetry:
                return None
            for flag in ("skip_dep_check", "raise_exception_on_conflict"):
                kwargs.pop(flag, None)
            result = self._instrument(**kwargs)
            self._is_instrumented_by_opentelemetry = True
            return result

        def uninstrument(self, **kwargs):
            if not self._is_instrumented_by_opentelemetry:
                return None
            result = self._uninstrument(**kwargs)
            self._is_instrumented_by_opentelemetry = False
            return result

__all__ = ["Instrumentor", "PerProcess"]

log = logging.getLogger(__name__)


class Instrumentor(_Base):
    """BaseInstrumentor with instrument() and uninstrument() atomic (its own flag check is
    not). One instance per subclass and process; each subclass gets its own lock."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._lock = threading.RLock()

    def instrument(self, **kwargs):
        with self._lock:
            return super().instrument(**kwargs)

    def uninstrument(self, **kwargs):
        with self._lock:
            return super().uninstrument(**kwargs)


class PerProcess:
    """The adapter `build(tel)` makes, built on the first measured call in each process:
    with the Telemetry given to instrument() in the process that gave it, else with one
    `dpobs.start()` starts (every setting from DPOBS_*). A forked child builds its own."""

    def __init__(self, build: Callable, what: str, telemetry=None):
        self._build_adapter = build
        self._what = what  # for the log line: whose first call could not start dpobs
        self._given = telemetry
        self._given_pid = os.getpid()
        self._lock = threading.Lock()
        self._pid = None
        self._adapter = None
        self._tel = None
        self.started = None  # the Telemetry this object started, if any

    def telemetry(self):
        """This process's Telemetry (started on first use), or None if it cannot start."""
        return None if self.adapter() is None else self._tel

    def adapter(self):
        if self._pid == os.getpid():
            return self._adapter
        with self._lock:
            if self._pid != os.getpid():
                self._adapter = self._build()
                self._pid = os.getpid()
        return self._adapter

    def _build(self):
        try:
            tel = self._given if os.getpid() == self._given_pid else None
            if tel is None:
                import dpobs_otel

                tel = self.started = dpobs_otel.start()
            self._tel = tel
            return self._build_adapter(tel)
        except Exception:
            log.exception("dpobs: could not start on %s's first call in pid %d; its calls run "
                          "unmeasured", self._what, os.getpid())
            return None

    def close(self) -> None:
        if self.started is not None and self._pid == os.getpid():
            self.started.shutdown()
        self.started = self._adapter = self._pid = self._tel = None
