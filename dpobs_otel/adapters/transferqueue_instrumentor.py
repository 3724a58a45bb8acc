"""TransferQueue measured with no code change, the OpenTelemetry way.

    opentelemetry-instrument python train.py     # activates every installed instrumentor

or, in code that would rather say so:

    from dpobs_otel.adapters.transferqueue_instrumentor import TransferQueueInstrumentor
    TransferQueueInstrumentor().instrument()      # idempotent and thread-safe
    TransferQueueInstrumentor().uninstrument()    # puts TransferQueue's own functions back

`instrument()` replaces the twelve kv_* functions of the `transfer_queue` package (sync and
async) with measured ones, and measures the client classes TransferQueueClient and
AsyncTransferQueueClient (get_meta, put, get_data, clear_samples, clear_partition and their
async forms; tq_client.py). The first measured call in a process starts dpobs there
(`dpobs.start()`, every setting from its DPOBS_* variable: role, rank, sd_dir, the guard...),
so a process that imports transfer_queue but never calls it serves nothing; a forked child
starts its own on its first call. `instrument(telemetry=tel)` uses an existing Telemetry in
the process that called it instead. Each measured call goes through the same adapter as
`dpobs_otel.adapters.transferqueue.instrument(tel)`: same ops, bytes, errors and guard.

Code that bound a function before instrumenting (`from transfer_queue import kv_put`) keeps
the unmeasured one, as with any OpenTelemetry instrumentor. dpobs never fails a call it
measures: if it cannot start, the call goes to TransferQueue unmeasured (logged once).
"""
from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
from typing import Collection

try:
    from opentelemetry.instrumentation.instrumentor import BaseInstrumentor
except ImportError:  # DPOBS_AUTO=1 needs no OpenTelemetry launcher, hence not its package
    class BaseInstrumentor:
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

from .transferqueue import MEASURED

__all__ = ["TransferQueueInstrumentor", "KV_FUNCTIONS"]

log = logging.getLogger(__name__)

_KV = ("kv_put", "kv_batch_put", "kv_batch_get", "kv_batch_get_by_meta", "kv_list", "kv_clear")
KV_FUNCTIONS = _KV + tuple("async_" + name for name in _KV)


class _Originals:
    """The transfer_queue module as the adapter must see it: its own kv_* functions (not the
    measured ones that now sit on the module), everything else from the module."""

    def __init__(self, module, originals: dict):
        self.__dict__.update(originals)
        self._module = module

    def __getattr__(self, name):  # only for names not set in __init__
        return getattr(self.__dict__["_module"], name)


class _PerProcess:
    """The adapter, built on the first measured call in each process."""

    def __init__(self, module, originals: dict, telemetry=None):
        self._module = _Originals(module, originals)
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
        from .transferqueue import InstrumentedTransferQueue

        try:
            tel = self._given if os.getpid() == self._given_pid else None
            if tel is None:
                import dpobs_otel

                tel = self.started = dpobs_otel.start()
            self._tel = tel
            return InstrumentedTransferQueue(tel, self._module)
        except Exception:
            log.exception("dpobs: could not start on TransferQueue's first call in pid %d; "
                          "its calls run unmeasured", os.getpid())
            return None

    def close(self) -> None:
        if self.started is not None and self._pid == os.getpid():
            self.started.shutdown()
        self.started = self._adapter = self._pid = self._tel = None


def _measured(name: str, original, per_process: _PerProcess):
    """`original` measured through the adapter's method of the same name and signature."""
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def measured(*args, **kwargs):
            adapter = per_process.adapter()
            if adapter is None:
                return await original(*args, **kwargs)
            return await getattr(adapter, name)(*args, **kwargs)
    else:
        @functools.wraps(original)
        def measured(*args, **kwargs):
            adapter = per_process.adapter()
            if adapter is None:
                return original(*args, **kwargs)
            return getattr(adapter, name)(*args, **kwargs)
    setattr(measured, MEASURED, True)  # the adapter calls __wrapped__ instead
    return measured


class TransferQueueInstrumentor(BaseInstrumentor):
    """See the module docstring. One instance per process (BaseInstrumentor is a singleton)."""

    _lock = threading.RLock()

    def instrumentation_dependencies(self) -> Collection[str]:
        return ("transferqueue == 0.1.11",)

    def instrument(self, **kwargs):
        with self._lock:  # BaseInstrumentor's own flag check is not atomic
            return super().instrument(**kwargs)

    def uninstrument(self, **kwargs):
        with self._lock:
            return super().uninstrument(**kwargs)

    def _instrument(self, **kwargs):
        import transfer_queue

        from .tq_client import ClientPatches

        originals = {name: getattr(transfer_queue, name) for name in KV_FUNCTIONS}
        self._per_process = _PerProcess(transfer_queue, originals, kwargs.get("telemetry"))
        self._originals = originals
        self._clients = ClientPatches(transfer_queue, self._per_process.telemetry)
        for name, fn in originals.items():
            setattr(transfer_queue, name, _measured(name, fn, self._per_process))
        self._clients.install()

    def _uninstrument(self, **kwargs):
        import transfer_queue

        for name, fn in self._originals.items():
            setattr(transfer_queue, name, fn)
        self._clients.uninstall()
        self._per_process.close()
