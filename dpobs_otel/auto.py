"""`DPOBS_AUTO=1`: measure TransferQueue, Mooncake's store, verl's checkpoint engines and Ray's
object store in every Python process, with no code change and no launcher.

The wheel installs `dpobs-otel-auto.pth` into site-packages; Python runs its one line at
every interpreter start. That line imports this module only when DPOBS_AUTO is set, and
this module imports nothing but the standard library (and dpobs_otel.config, which imports
nothing else): an interpreter that never imports `transfer_queue` pays a dictionary lookup
and no torch, ray or OpenTelemetry import.

`install()` reads the off switch (DPOBS_DISABLED, OTEL_SDK_DISABLED) first: off, nothing is
hooked. On, it puts a finder first on sys.meta_path that notices the import of
`transfer_queue`, `mooncake.store`, `verl.checkpoint_engine`, verl's trainer
(`verl.trainer.ppo.ray_trainer`) or `ray`; once the module has executed, its instrumentor
(TransferQueueInstrumentor, MooncakeInstrumentor, VerlInstrumentor, VerlStepInstrumentor,
RayInstrumentor) instruments it (dpobs.start() then runs
lazily on the first measured call, every setting from DPOBS_*, role and rank included).
Because it is environment-driven, it reaches every process an environment reaches: Ray
actors through runtime_env={"env_vars": {"DPOBS_AUTO": "1", ...}}, torchrun and srun ranks,
multiprocessing children. A failure to instrument is logged and never stops the import.

Invisible to the program: the finder hands the import system the very spec the other
finders make (same loader object and type, origin, submodule locations), so
importlib.resources, inspect.getsource, pickling and importlib.reload see what they see
without dpobs. Its one hook is an `exec_module` attribute set on that loader object for the
one execution and deleted as soon as it ran: afterwards the loader is exactly its own.
"""
from __future__ import annotations

import importlib
import importlib.abc
import logging
import os
import sys

# module -> (its instrumentor's module, class), imported only once the module is
TARGETS = {"transfer_queue": ("transferqueue", "TransferQueueInstrumentor"),
           "mooncake.store": ("mooncake", "MooncakeInstrumentor"),
           "verl.checkpoint_engine": ("verl", "VerlInstrumentor"),
           "verl.trainer.ppo.ray_trainer": ("verl", "VerlStepInstrumentor"),
           "ray": ("ray", "RayInstrumentor")}
log = logging.getLogger("dpobs_otel.auto")


def enabled(env=os.environ) -> bool:
    """DPOBS_AUTO: a value that is not a boolean is said in one line and hooks nothing."""
    from .config import environment_switch
    return environment_switch("DPOBS_AUTO", env, bad_means=False,
                              instead="nothing is hooked (the default)")


def _switched_off() -> bool:
    """The off switch, read before anything is hooked (a malformed value is said there and
    hooks nothing)."""
    from .config import disabled
    return disabled()


def _instrument(module) -> None:
    try:
        where, name = TARGETS[module.__name__]
        instrumentor = getattr(importlib.import_module(f"{__package__}.adapters.{where}"), name)
        instrumentor().instrument()
    except Exception:  # never fail the user's import
        log.warning("dpobs: DPOBS_AUTO could not instrument %s", module.__name__,
                    exc_info=True)


def _after_exec(loader, name: str) -> bool:
    """Instrument module `name` right after `loader` executed it, through an `exec_module`
    set on the loader object for that one call (the object and its type stay the
    module's own). False where the loader takes no attribute."""
    run = loader.exec_module  # the loader's own, bound

    def exec_module(module):
        try:
            run(module)
        finally:
            loader.__dict__.pop("exec_module", None)  # the loader is its own again
        if module.__name__ == name:
            _instrument(module)

    try:
        loader.exec_module = exec_module
    except (AttributeError, TypeError):
        return False
    return True


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in TARGETS or name in sys.modules:  # a reload: nothing to add
            return None
        spec = _next_spec(self, name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        if not _after_exec(spec.loader, name):
            log.warning("dpobs: DPOBS_AUTO cannot instrument %s (its loader %r takes no "
                        "hook); it runs unmeasured", name, spec.loader)
        return spec


def _next_spec(finder, name, path, target):
    """The spec the finders after `finder` on sys.meta_path make: what the import system
    would have used without dpobs."""
    finders = sys.meta_path
    for other in finders[finders.index(finder) + 1:] if finder in finders else finders:
        find = getattr(other, "find_spec", None)
        spec = None if find is None else find(name, path, target)
        if spec is not None:
            return spec
    return None


def install() -> None:
    """Instrument each target when (or, if already imported, now that) it is imported;
    nothing at all when dpobs is switched off."""
    if not enabled() or _switched_off() or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    for name in TARGETS:
        if name in sys.modules:
            _instrument(sys.modules[name])
    if not all(name in sys.modules for name in TARGETS):
        sys.meta_path.insert(0, _Finder())
