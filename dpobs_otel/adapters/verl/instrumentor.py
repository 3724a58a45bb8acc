"""verl's checkpoint engines measured with no code change, the OpenTelemetry way.

    opentelemetry-instrument python train.py     # activates every installed instrumentor
    DPOBS_AUTO=1 python train.py                 # the same without the launcher (auto.py)

or in code: `VerlInstrumentor().instrument()` / `.uninstrument()` (idempotent, thread-safe).

`instrument()` puts measured send_weights and receive_weights on every subclass of
`verl.checkpoint_engine.CheckpointEngine` that defines them, now and as later subclasses
are defined (engines.py), and takes them off again on `uninstrument()`. dpobs starts on the
first measured call in each process (`dpobs.start()`, every setting from DPOBS_*: role,
rank, the guard...); a forked child starts its own; `instrument(telemetry=tel)` measures
into an existing Telemetry in the process that called it. If dpobs cannot start, every call
goes to the engine unmeasured (logged once). With dpobs switched off (DPOBS_DISABLED,
OTEL_SDK_DISABLED) nothing of verl is touched.

Under the launcher, instrument() imports verl.checkpoint_engine (and with it verl, Ray and
transformers) at start-up, as every instrumentor imports its library; DPOBS_AUTO=1 waits
for the program's own import of it.
"""
from __future__ import annotations

from typing import Collection

from ..instrumentation import Instrumentor, PerProcess
from .package import _instruments

__all__ = ["VerlInstrumentor"]


def _adapter(tel):
    from .syncs import VerlWeights
    return VerlWeights(tel)


class VerlInstrumentor(Instrumentor):
    """See the module docstring. One instance per process (BaseInstrumentor is a singleton)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs):
        from verl.checkpoint_engine.base import CheckpointEngine

        from .calls import measured_receive, measured_send
        from .engines import EnginePatches

        per_process = PerProcess(_adapter, "verl's checkpoint engine", kwargs.get("telemetry"))
        makers = {"send_weights": measured_send, "receive_weights": measured_receive}
        self._per_process = per_process
        self._patches = EnginePatches(
            CheckpointEngine, lambda name, fn: makers[name](fn, per_process.adapter))
        self._patches.install()

    def _uninstrument(self, **kwargs):
        self._patches.uninstall()
        self._per_process.close()
