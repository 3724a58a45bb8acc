"""Ray's object store measured with no code change, the OpenTelemetry way.

    opentelemetry-instrument python driver.py   # activates every installed instrumentor
    DPOBS_AUTO=1 python driver.py               # the same without the launcher (auto.py)
    dpobs_otel.adapters.ray.instrument(tel)     # or in code, into a started Telemetry

`instrument()` replaces ray.put, ray.get and ray.wait, the submission of actor methods and
remote functions, and hooks Ray's serializer (ops.py; the private names in
shims/ray_private.py). Every Ray worker that inherits DPOBS_AUTO=1 (runtime_env env_vars,
the cluster's environment) does the same when it imports Ray, so its side of each call
(ray_args, ray_return) is measured too. dpobs starts at a process's first measured op
(`dpobs.start()`, settings from DPOBS_*); without DPOBS_ROLE a worker's role is its actor
class and a driver's `driver`. Ray's own processes (dashboard, agents, monitors) import Ray
too: they are recognised by their program and never measured. A driver with an sd_dir also
announces each Ray node's own exporter there (nodes.py). A Ray outside the supported
range, or with dpobs switched off, is left exactly as it is.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import Collection

from ..instrumentation import Instrumentor, PerProcess
from .package import _instruments

__all__ = ["RayInstrumentor", "instrument"]
log = logging.getLogger(__name__)


def _ray_own_process(argv0: str, ray_dir: str) -> bool:
    """Is this one of Ray's own processes (dashboard, agents, log monitor...), which run
    programs inside the ray package, rather than a driver or a worker (default_worker.py)?"""
    path = os.path.realpath(argv0) if argv0 else ""
    return path.startswith(os.path.realpath(ray_dir) + os.sep) \
        and os.path.basename(path) != "default_worker.py"


def _defaults() -> dict:
    """The role of a process dpobs starts in: its actor class, or `driver` (DPOBS_ROLE, read
    by dpobs.start(), wins)."""
    from ...shims import ray_private
    try:
        if not ray_private.in_worker():
            return {"role": "driver"}
        cls, dot, _ = ray_private.current_task().partition(".")
        return {"role": ray_private.hosted_class() or (cls if dot and cls else "ray-task")}
    except Exception:
        return {}


class RayInstrumentor(Instrumentor):
    """See the module docstring. One instance per process (BaseInstrumentor is a singleton)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs):
        import ray
        self._undo = []
        if _ray_own_process(sys.argv[0] if sys.argv else "", os.path.dirname(ray.__file__)):
            return
        from ...shims.ray_private import missing
        from .meter import RayMeter
        from .nodes import announce
        from .patching import install
        lacking = missing()

        def build(tel):  # a driver also announces Ray's node exporters (nodes.py)
            self._nodes = announce(tel)
            return RayMeter(tel, lacking)

        self._nodes = None
        per_process = PerProcess(build, "Ray's object store", kwargs.get("telemetry"),
                                 _defaults)
        self._per_process = per_process
        self._undo = install(per_process, lacking)

    def _uninstrument(self, **kwargs):
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        if getattr(self, "_nodes", None) is not None:
            self._nodes.close()
            self._nodes = None
        if getattr(self, "_per_process", None) is not None:
            self._per_process.close()
            self._per_process = None


def instrument(tel):
    """Measure Ray's object store in this process into `tel` (a started Telemetry)."""
    return RayInstrumentor().instrument(telemetry=tel)
