"""Ray's object store as a data plane (DESIGN.md, "Ray's object store as a data plane").

    DPOBS_AUTO=1 python driver.py                  # zero code, driver and every worker that
                                                   # inherits the variable (runtime_env)
    opentelemetry-instrument python driver.py      # the launcher (RayInstrumentor)
    dpobs_otel.adapters.ray.instrument(tel)        # in code

Ops: ray_put, ray_get (also `await ref`), ray_wait, ray_call (a remote call's submission),
ray_args and ray_return (the executing worker's side), with keys, errors by exception class,
bytes as Ray's object sizes and the `method` attribute; each op's moving-data part apart from
its wait, and its bytes by locality. docs/guides/ray-object-store.md says what is seen.

    instrumentor.py  RayInstrumentor, instrument(tel)
    patching.py      the patches put in place and taken off
    ops.py           the measured entry points and the serializer hooks
    methods.py       method labels (bounded) and the refs each call returned
    locality.py      where an op's objects were, and when a get's moving-data part began
    meter.py         the account of the ops, beside the core's
    package.py       the Ray releases it instruments

Only the instrumentor is imported with the package (the OpenTelemetry launcher loads every
entry point at start-up); the rest loads when Ray is instrumented.
"""
from __future__ import annotations

from .instrumentor import RayInstrumentor, instrument

__all__ = ["RayInstrumentor", "instrument"]
