"""`DPOBS_AUTO=1`: measure TransferQueue and Mooncake's store in every Python process, with no
code change and no launcher.

The wheel installs `dpobs-otel-auto.pth` into site-packages; Python runs its one line at
every interpreter start. That line imports this module only when DPOBS_AUTO is set, and
this module imports nothing but the standard library: an interpreter that never imports
`transfer_queue` pays a dictionary lookup and no torch, ray or OpenTelemetry import.

`install()` puts a finder first on sys.meta_path that notices the import of
`transfer_queue` or `mooncake.store`; once the module has executed, its instrumentor
(TransferQueueInstrumentor, MooncakeInstrumentor) instruments it
(dpobs.start() then runs lazily on the first measured call, every setting from DPOBS_*,
role and rank included). Because it is environment-driven, it reaches every process an
environment reaches: Ray actors through runtime_env={"env_vars": {"DPOBS_AUTO": "1", ...}},
torchrun and srun ranks, multiprocessing children. A failure to instrument is logged and
never stops the import.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import os
import sys

# module -> (its instrumentor's module, class), imported only once the module is
TARGETS = {"transfer_queue": ("transferqueue", "TransferQueueInstrumentor"),
           "mooncake.store": ("mooncake", "MooncakeInstrumentor")}
log = logging.getLogger("dpobs_otel.auto")


def enabled(env=os.environ) -> bool:
    return env.get("DPOBS_AUTO", "").strip().lower() in ("1", "true", "yes", "on")


def _instrument(module) -> None:
    try:
        where, name = TARGETS[module.__name__]
        instrumentor = getattr(importlib.import_module(f"{__package__}.adapters.{where}"), name)
        instrumentor().instrument()
    except Exception:  # never fail the user's import
        log.warning("dpobs: DPOBS_AUTO could not instrument %s", module.__name__,
                    exc_info=True)


class _Loader(importlib.abc.Loader):
    """The real loader, then the instrumentor."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _instrument(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in TARGETS:
            return None
        sys.meta_path.remove(self)  # once: the real finders locate the package
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


def install() -> None:
    """Instrument each target when (or, if already imported, now that) it is imported."""
    if not enabled() or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    for name in TARGETS:
        if name in sys.modules:
            _instrument(sys.modules[name])
    if not all(name in sys.modules for name in TARGETS):
        sys.meta_path.insert(0, _Finder())
