"""TransferQueue measured with no code change, the OpenTelemetry way.

    opentelemetry-instrument python train.py     # activates every installed instrumentor

or, in code that would rather say so:

    from dpobs_otel.adapters.transferqueue import TransferQueueInstrumentor
    TransferQueueInstrumentor().instrument()      # idempotent and thread-safe
    TransferQueueInstrumentor().uninstrument()    # puts TransferQueue's own functions back

`instrument()` replaces the twelve kv_* functions of the `transfer_queue` package (sync and
async) with measured ones, init and close with ones that turn TransferQueue's own exporter
on when asked and announce it (store_metrics.py), and measures the client classes
TransferQueueClient and AsyncTransferQueueClient (get_meta, put, get_data, clear_samples,
clear_partition and their async forms; client.py). The first call of any of these in a
process (init, usually) starts dpobs there
(`dpobs.start()`, every setting from its DPOBS_* variable: role, rank, sd_dir, the guard...),
so a process that imports transfer_queue but never calls it serves nothing; a forked child
starts its own on its first call. `instrument(telemetry=tel)` uses an existing Telemetry in
the process that called it instead. Each measured call goes through the same adapter as
`dpobs_otel.adapters.transferqueue.instrument(tel)`: same ops, bytes, errors and guard.
Each user call is measured once, wherever it comes from (the user's code or TransferQueue's
own modules, its streaming dataset for one): the calls dpobs makes inside it are marked as
its own (instrumentation.own_calls) and pass through every patched entry point.

Code that bound a function before instrumenting (`from transfer_queue import kv_put`) keeps
the unmeasured one, as with any OpenTelemetry instrumentor. dpobs never fails a call it
measures: if it cannot start, the call goes to TransferQueue unmeasured (logged once).
"""
from __future__ import annotations

import functools
import inspect
from typing import Collection

from ..instrumentation import MEASURED, Instrumentor, PerProcess, is_own_call
from .package import _instruments

__all__ = ["TransferQueueInstrumentor", "KV_FUNCTIONS"]


_KV = ("kv_put", "kv_batch_put", "kv_batch_get", "kv_batch_get_by_meta", "kv_list", "kv_clear")
KV_FUNCTIONS = _KV + tuple("async_" + name for name in _KV)
# With the store's exporter and its file_sd announcement (store_metrics.py).
LIFECYCLE = ("init", "close")


class _Originals:
    """The transfer_queue module as the adapter must see it: its own kv_* functions (not the
    measured ones that now sit on the module), everything else from the module."""

    def __init__(self, module, originals: dict):
        self.__dict__.update(originals)
        self._module = module

    def __getattr__(self, name):  # only for names not set in __init__
        return getattr(self.__dict__["_module"], name)


def _measured(name: str, original, per_process: PerProcess):
    """`original` measured through the adapter's method of the same name and signature."""
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def measured(*args, **kwargs):
            adapter = None if is_own_call() else per_process.adapter()
            if adapter is None:
                return await original(*args, **kwargs)
            return await getattr(adapter, name)(*args, **kwargs)
    else:
        @functools.wraps(original)
        def measured(*args, **kwargs):
            adapter = None if is_own_call() else per_process.adapter()
            if adapter is None:
                return original(*args, **kwargs)
            return getattr(adapter, name)(*args, **kwargs)
    setattr(measured, MEASURED, True)  # the adapter calls __wrapped__ instead
    return measured


class TransferQueueInstrumentor(Instrumentor):
    """See the module docstring. One instance per process (BaseInstrumentor is a singleton)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs):
        import transfer_queue

        from .client import ClientPatches
        from .kv import InstrumentedTransferQueue

        originals = {name: getattr(transfer_queue, name) for name in KV_FUNCTIONS + LIFECYCLE}
        module = _Originals(transfer_queue, originals)
        self._per_process = PerProcess(lambda tel: InstrumentedTransferQueue(tel, module),
                                       "TransferQueue", kwargs.get("telemetry"))
        self._originals = originals
        self._clients = ClientPatches(self._per_process.telemetry)
        for name, fn in originals.items():
            setattr(transfer_queue, name, _measured(name, fn, self._per_process))
        self._clients.install()

    def _uninstrument(self, **kwargs):
        import transfer_queue

        for name, fn in self._originals.items():
            setattr(transfer_queue, name, fn)
        self._clients.uninstall()
        self._per_process.close()
