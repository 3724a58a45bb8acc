"""Mooncake's store measured with no code change, the OpenTelemetry way.

    opentelemetry-instrument python train.py     # activates every installed instrumentor
    DPOBS_AUTO=1 python train.py                 # the same without the launcher (auto.py)

or in code: `MooncakeInstrumentor().instrument()` / `.uninstrument()` (idempotent,
thread-safe).

`instrument()` replaces the measured methods of `mooncake.store.MooncakeDistributedStore`
(the put / get / remove families of mooncake_store.MEASURED that this build has) on the
class itself, so every store in the process, made before or after, is measured as
`instrument_store(tel, store)` measures one: same ops, bytes, error codes, missing keys.
dpobs starts on the first measured call in each process (`dpobs.start()`, settings from
DPOBS_*); a forked child starts its own. Occupancy is per process: raw keys are one
namespace in a Mooncake cluster, whichever store object wrote them. Calls that dpobs's own
Mooncake adapters make (MooncakeDataPlane, instrument_store) are theirs to measure, not
counted twice. If dpobs cannot start, the call goes to Mooncake unmeasured (logged once).
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Collection

from .instrumentation import Instrumentor, PerProcess

__all__ = ["MooncakeInstrumentor"]

_HERE = os.path.dirname(os.path.abspath(__file__))
# Callers whose store calls are already measured (or are the measuring itself).
_ADAPTERS = frozenset(os.path.join(_HERE, f) for f in ("mooncake.py", "mooncake_store.py",
                                                       "mooncake_index.py",
                                                       "mooncake_leases.py"))


def _from_adapter() -> bool:
    """Was the patched method called from one of dpobs's Mooncake adapters?"""
    return sys._getframe(2).f_code.co_filename in _ADAPTERS


def _measured(name: str, op: str, reader, original, per_process: PerProcess):
    @functools.wraps(original)
    def measured(self, *args, **kwargs):
        accountant = None if _from_adapter() else per_process.adapter()
        if accountant is None:
            return original(self, *args, **kwargs)
        bound = functools.partial(original, self)
        return accountant.measure(op, reader, name, bound, args, kwargs)
    return measured


class MooncakeInstrumentor(Instrumentor):
    """See the module docstring. One instance per process (BaseInstrumentor is a singleton)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        # Two wheels provide mooncake.store (mooncake-transfer-engine and its -non-cuda
        # build), and a requirement can name only one: the import tells instead (the
        # launcher skips an instrumentor whose module is not installed).
        return ()

    def _instrument(self, **kwargs):
        from mooncake.store import MooncakeDistributedStore as Store

        from .mooncake_store import MEASURED, InstrumentedMooncakeStore

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
