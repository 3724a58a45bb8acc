"""The one interface of a process's telemetry: what `dpobs.start()` returns, on or off.

Telemetry (dpobs on) and DisabledTelemetry (DPOBS_DISABLED=1, OTEL_SDK_DISABLED=true) both
derive from TelemetryInterface, so a name the user or an adapter reaches on one exists on
the other; tests/test_facade.py holds both to it and walks every adapter entry point with
each. Whatever lies beyond it (the core's bookkeeping: stats, critical, op_records, an
instrumented client's own methods) is reached only behind `enabled`: off, an adapter hands
the user's object back, and every call goes to the library unmeasured.
"""
from __future__ import annotations

import abc
import contextlib


class TelemetryInterface(abc.ABC):
    enabled: bool  # False: nothing is measured, served or written
    # None when off (or when that part is off)
    settings = guard = row_age = tracer = None
    endpoint = url = registry = None

    @abc.abstractmethod
    def instrument(self, inner):
        """`inner` measured (off: `inner` itself)."""

    weights = None  # the weight-sync API (weights/): sent, received, sync; off: does nothing

    @abc.abstractmethod
    def step(self):
        """A context manager: one training step."""

    @abc.abstractmethod
    def waiting(self):
        """A context manager: the step's thread or task blocked on the data plane."""

    @abc.abstractmethod
    def exposed(self, iterable):
        """`iterable`, its next() / __anext__ counted as exposed time."""

    @abc.abstractmethod
    def codec(self, stage: str):
        """A context manager: codec work outside the client."""

    @abc.abstractmethod
    def step_metrics(self) -> dict[str, float]: ...

    @abc.abstractmethod
    def cluster_step_metrics(self, source, *, job: str | None = None,
                             timeout: float = 1.0) -> dict[str, float]: ...

    @abc.abstractmethod
    def cluster_breakdown(self, source) -> tuple[list[str], list[list]]: ...

    @abc.abstractmethod
    def internal_error(self, component: str, exc: BaseException) -> None:
        """Count and log an error of dpobs itself; never raises."""

    @abc.abstractmethod
    def shutdown(self) -> None: ...

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


class DisabledTelemetry(TelemetryInterface):
    """What start() returns when dpobs is switched off: the user's code runs unchanged."""

    enabled = False

    def instrument(self, inner):
        return inner

    @property
    def weights(self):
        from .weights import DisabledWeights
        return DisabledWeights()

    def step(self):
        return contextlib.nullcontext()

    def codec(self, stage: str):
        return contextlib.nullcontext()

    def waiting(self):
        return contextlib.nullcontext()

    def exposed(self, iterable):
        return iterable

    def step_metrics(self) -> dict[str, float]:
        return {}

    def cluster_step_metrics(self, source, *, job: str | None = None,
                             timeout: float = 1.0) -> dict[str, float]:
        return {}

    def cluster_breakdown(self, source) -> tuple[list[str], list[list]]:
        return [], []

    def internal_error(self, component: str, exc: BaseException) -> None:
        pass

    def shutdown(self) -> None:
        pass
