"""Which classes get measured methods: every subclass of verl's CheckpointEngine, those that
exist when instrument() runs and those defined afterwards, without naming any backend.

Why the base class and not the registry: a backend is a subclass whatever way it is found
(CheckpointEngineRegistry.new, `custom_backend_module`, a user who instantiates their class
directly), while the registry only sees the ones registered through it. Why each subclass
and not the base class's own methods: every backend overrides send_weights and
receive_weights (they are abstract on the base), so the function that runs is the
subclass's own; it is replaced on the class that defines it, in that class's __dict__.
Subclasses defined later are caught by an `__init_subclass__` set on the base class for as
long as the instrumentor is on (it chains to whatever the base class inherits).

A subclass that overrides a method and calls super()'s measures once: the measured function
measures only when it is the one the engine's own class resolves (calls.py).
"""
from __future__ import annotations

import inspect
import logging
import threading
from typing import Callable

from ..instrumentation import MEASURED

log = logging.getLogger(__name__)
METHODS = ("send_weights", "receive_weights")
_HOOK = "__init_subclass__"


def subclasses(base: type) -> list[type]:
    """Every class below `base`, each once, parents before children."""
    seen, order, todo = set(), [], [base]
    while todo:
        for cls in todo.pop(0).__subclasses__():
            if cls not in seen:
                seen.add(cls)
                order.append(cls)
                todo.append(cls)
    return order


def _measurable(fn) -> bool:
    return (inspect.isfunction(fn) and not getattr(fn, MEASURED, False)
            and not getattr(fn, "__isabstractmethod__", False))


class EnginePatches:
    """The measured methods on `base`'s subclasses; `measure(name, fn)` makes one."""

    def __init__(self, base: type, measure: Callable):
        self._base = base
        self._measure = measure
        self._lock = threading.Lock()
        self._originals: dict[tuple[type, str], Callable] = {}
        self._own_hook = None  # the base class's own __init_subclass__, if it has one

    def install(self) -> None:
        base, patches = self._base, self
        self._own_hook = base.__dict__.get(_HOOK)
        inherited = self._own_hook

        def __init_subclass__(cls, **kwargs):
            if inherited is not None:
                inherited.__get__(None, cls)(**kwargs)
            else:
                super(base, cls).__init_subclass__(**kwargs)
            patches.patch(cls)

        for cls in subclasses(base):
            self.patch(cls)
        setattr(base, _HOOK, classmethod(__init_subclass__))

    def patch(self, cls: type) -> None:
        """The measured methods that `cls` itself defines (never a parent's, twice). It runs
        inside the definition of the user's class: a failure leaves the method unmeasured,
        logged, and never fails the class statement."""
        with self._lock:
            for name in METHODS:
                fn = cls.__dict__.get(name)
                if not _measurable(fn):
                    continue
                try:
                    setattr(cls, name, self._measure(name, fn))
                except Exception:
                    log.warning("dpobs: %s.%s left unmeasured", cls.__qualname__, name,
                                exc_info=True)
                    continue
                self._originals[(cls, name)] = fn

    def uninstall(self) -> None:
        with self._lock:
            if self._own_hook is None:
                delattr(self._base, _HOOK)
            else:
                setattr(self._base, _HOOK, self._own_hook)
            for (cls, name), fn in self._originals.items():
                setattr(cls, name, fn)
            self._originals.clear()

    def patched(self) -> dict[tuple[type, str], Callable]:
        """(class, method) -> the engine's own function, for every method measured now."""
        with self._lock:
            return dict(self._originals)
