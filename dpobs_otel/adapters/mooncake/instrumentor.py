"""Mooncake's store measured with no code change, the OpenTelemetry way.

    opentelemetry-instrument python train.py     # activates every installed instrumentor
    DPOBS_AUTO=1 python train.py                 # the same without the launcher (auto.py)

or in code: `MooncakeInstrumentor().instrument()` / `.uninstrument()` (idempotent,
thread-safe).

`instrument()` replaces the measured methods of `mooncake.store.MooncakeDistributedStore`
(the put / get / remove families of store.MEASURED that this build has) on the class
itself, so every store in the process, made before or after, is measured as
`instrument_store(tel, store)` measures one: same ops, bytes, error codes, missing keys.
dpobs starts on the first measured call in each process (`dpobs.start()`, settings from
DPOBS_*); a forked child starts its own. Occupancy is per process: raw keys are one
namespace in a Mooncake cluster, whichever store object wrote them. Calls that dpobs's own
Mooncake adapters make (MooncakeDataPlane, instrument_store) are marked as theirs
(instrumentation.own_calls) and are not counted twice. If dpobs cannot start, the call goes
to Mooncake unmeasured (logged once).
"""
from __future__ import annotations

import functools
from typing import Collection

from ..instrumentation import Instrumentor, PerProcess, is_own_call
from .package import _instruments_any

__all__ = ["MooncakeInstrumentor"]


def _measured(name: str, op: str, reader, original, per_process: PerProcess):
    @functools.wraps(original)
    def measured(self, *args, **kwargs):
        accountant = None if is_own_call() else per_process.adapter()
        if accountant is None:
            return original(self, *args, **kwargs)
        bound = functools.partial(original, self)
        return accountant.measure(op, reader, name, bound, args, kwargs)
    return measured


class MooncakeInstrumentor(Instrumentor):
    """See the module docstring. One instance per process (BaseInstrumentor is a singleton)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        """The requirement of the distribution that provides `mooncake` here (the first
        known one where none does, so the launcher's check says what is missing)."""
        import importlib.metadata

        provides = set(importlib.metadata.packages_distributions().get("mooncake", ()))
        named = [r for r in _instruments_any if r.split()[0] in provides]
        return tuple(named[:1] or _instruments_any[:1])

    def supported(self):
        return _instruments_any

    def _instrument(self, **kwargs):
        from mooncake.store import MooncakeDistributedStore as Store

        from .store import MEASURED, InstrumentedMooncakeStore

        # One accountant per process; it never calls its store (None), only bookkeeps.
        self._per_process = PerProcess(lambda tel: InstrumentedMooncakeStore(tel, None),
                                       "Mooncake", kwargs.get("telemetry"))
        self._originals = {m: getattr(Store, m) for m in MEASURED if hasattr(Store, m)}
        for name, fn in self._originals.items():
            op, reader = MEASURED[name]
            setattr(Store, name, _measured(name, op, reader, fn, self._per_process))

    def _uninstrument(self, **kwargs):
        from mooncake.store import MooncakeDistributedStore as Store

        for name, fn in self._originals.items():
            setattr(Store, name, fn)
        self._per_process.close()
