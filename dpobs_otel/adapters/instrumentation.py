"""What dpobs's OpenTelemetry-style instrumentors share (transferqueue.instrumentor,
mooncake.instrumentor): the BaseInstrumentor they derive from, made thread-safe, the
per-process adapter that the first measured call in each process builds, and the mark of
dpobs's own calls.

Own calls: an adapter's calls into its data plane are measured by the adapter (or are its
bookkeeping), so the entry points an instrumentor patches pass them through unmeasured. The
adapter marks them with a context variable, as OpenTelemetry's `suppress_instrumentation`
does: `with own_calls(): ...` around the calls, `is_own_call()` in the patched entry point.
A context variable follows the code into coroutines and into run_coroutine_threadsafe's
task, but not onto an executor's thread (run_in_executor) or a new thread: the mark is set
on the thread that makes the calls.

opentelemetry-instrumentation is optional: DPOBS_AUTO=1 needs no OpenTelemetry launcher, so
without the package a small stand-in with the same contract is used.
"""
from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.metadata
import logging
import os
import re
import threading
import weakref
from typing import Callable

try:
    from opentelemetry.instrumentation.instrumentor import BaseInstrumentor as _Base
except ImportError:
    class _Base:
        """The part of opentelemetry-instrumentation's BaseInstrumentor used here: one
        instance per class, instrument() and uninstrument() each at most once in a row."""

        _instance = None
        _is_instrumented_by_opentelemetry = False

        def __new__(cls, *args, **kwargs):
            if cls._instance is None:
                cls._instance = object.__new__(cls)
            return cls._instance

        def instrument(self, **kwargs):
            if self._is_instrumented_by_opentelemetry:
                return None
            for flag in ("skip_dep_check", "raise_exception_on_conflict"):
                kwargs.pop(flag, None)
            result = self._instrument(**kwargs)
            self._is_instrumented_by_opentelemetry = True
            return result

        def uninstrument(self, **kwargs):
            if not self._is_instrumented_by_opentelemetry:
                return None
            result = self._uninstrument(**kwargs)
            self._is_instrumented_by_opentelemetry = False
            return result

__all__ = ["Instrumentor", "PerProcess", "own_calls", "own", "is_own_call", "OwnCalls",
           "MEASURED", "lazy_names"]

log = logging.getLogger(__name__)

_OWN = contextvars.ContextVar("dpobs_own_call", default=False)
# Marks a function an instrumentor put in place of a library's (its __wrapped__ is the
# library's own), so that an explicit adapter can call the library's one.
MEASURED = "__dpobs_measured__"


def is_own_call() -> bool:
    """Is the running code one of dpobs's own calls into a data plane (see own_calls)?"""
    return _OWN.get()


class own_calls:  # noqa: N801  (used like a function: `with own_calls():`)
    """Marks the calls made inside the block, on this thread and in the coroutines it
    starts, as dpobs's own: patched entry points pass them through unmeasured."""

    __slots__ = ("_token",)

    def __enter__(self):
        self._token = _OWN.set(True)

    def __exit__(self, *exc):
        _OWN.reset(self._token)


def own(fn: Callable) -> Callable:
    """`fn` with every call it makes marked as dpobs's own (own_calls), on the thread that
    runs it."""
    @functools.wraps(fn)
    def marked(*args, **kwargs):
        token = _OWN.set(True)
        try:
            return fn(*args, **kwargs)
        finally:
            _OWN.reset(token)
    return marked


class OwnCalls:
    """`inner` (a data plane's store) with every method call marked as dpobs's own, on
    whichever thread makes it; other attributes as they are."""

    def __init__(self, inner):
        self.__dict__["_inner"] = inner

    def __getattr__(self, name):  # only for names not cached in __dict__ yet
        attr = getattr(self.__dict__["_inner"], name)
        if not callable(attr):
            return attr
        marked = self.__dict__[name] = own(attr)
        return marked

    def __repr__(self) -> str:
        return f"OwnCalls({self.__dict__['_inner']!r})"


def lazy_names(package: str, where: dict[str, str]) -> Callable:
    """A package's module __getattr__ (PEP 562): `name` from its submodule where[name], imported
    on first use, so that importing the package (as the OpenTelemetry launcher does with every
    entry point) imports the instrumentor alone."""
    def __getattr__(name):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
    return __getattr__


_RANGE = re.compile(r"\s*([A-Za-z0-9_.-]+)\s*>=\s*([\w.]+)\s*,\s*<\s*([\w.]+)\s*")


def _release(version: str) -> tuple[int, ...]:
    """The release numbers of a version (0.3.13.post1 -> (0, 3, 13)): what ranges compare."""
    return tuple(int(p) for p in re.match(r"\d+(?:\.\d+)*", version)[0].split("."))


def out_of_range(requirements) -> str | None:
    """None when a distribution these "name >= low, < high" requirements name is installed
    in its range; else what was found, for the log."""
    found = []
    for requirement in requirements:
        name, low, high = _RANGE.fullmatch(requirement).groups()
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if _release(low) <= _release(version) < _release(high):
            return None
        found.append(f"{name} {version}")
    return (" and ".join(found) or "none of them installed") + \
        f"; dpobs-otel measures {' or '.join(requirements)}"


class Instrumentor(_Base):
    """BaseInstrumentor with instrument() and uninstrument() atomic (its own flag check is
    not). One instance per subclass and process; each subclass gets its own lock. With dpobs
    switched off (DPOBS_DISABLED, OTEL_SDK_DISABLED) instrument() patches nothing, so the
    library is exactly its own under `opentelemetry-instrument` or DPOBS_AUTO; a library
    outside supported() is left unmeasured, said once per process (whichever way
    instrument() is reached: the launcher, DPOBS_AUTO, code)."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._lock = threading.RLock()

    def supported(self):
        """The requirements one of which must hold: instrumentation_dependencies()."""
        return self.instrumentation_dependencies()

    def instrument(self, **kwargs):
        from ..config import disabled
        if disabled():
            return None
        with self._lock:
            why = out_of_range(self.supported())
            if why is not None:
                if not getattr(self, "_said", False):
                    self._said = True
                    log.warning("dpobs: %s left unmeasured: found %s", type(self).__name__, why)
                return None
            return super().instrument(**kwargs)

    def uninstrument(self, **kwargs):
        with self._lock:
            return super().uninstrument(**kwargs)


class _Shared:
    """The one Telemetry that instrumentors start in a process (zero code: TransferQueue's
    and Mooncake's instrumentors both measure into it, one endpoint and one file_sd target
    per process), shut down when the last of them lets go. A forked child starts its own."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pid = self._tel = None
        self._holders: set = set()

    def take(self, holder, defaults=None):
        """The process's Telemetry, started on first use; `defaults` (setting -> value) are
        used for settings the environment leaves unset (DPOBS_<NAME> always wins)."""
        with self._lock:
            if self._pid != os.getpid():
                import dpobs_otel

                given = {k: v for k, v in (defaults or {}).items()
                         if os.environ.get(f"DPOBS_{k.upper()}") is None}
                self._tel, self._pid = dpobs_otel.start(**given), os.getpid()
                self._holders = set()
            self._holders.add(holder)
            return self._tel

    def release(self, holder) -> None:
        with self._lock:
            if self._pid != os.getpid() or holder not in self._holders:
                return
            self._holders.discard(holder)
            if not self._holders:
                tel, self._tel, self._pid = self._tel, None, None
                tel.shutdown()


_SHARED = _Shared()


UNBUILT = object()  # PerProcess.current before this process has built its adapter
_LIVE: "weakref.WeakSet[PerProcess]" = weakref.WeakSet()


def _forget_in_child() -> None:
    """A forked child builds its own adapters (the parent's Telemetry is not its own)."""
    for per_process in list(_LIVE):
        per_process.current = UNBUILT


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_in_child)


class PerProcess:
    """The adapter `build(tel)` makes, built on the first measured call in each process:
    with the Telemetry given to instrument() in the process that gave it, else with the
    process's one started by the instrumentors (`dpobs.start()`, every setting from
    DPOBS_*). A forked child builds its own."""

    def __init__(self, build: Callable, what: str, telemetry=None, defaults=None):
        self._build_adapter = build
        self._defaults = defaults  # () -> settings for a start of dpobs (see _Shared.take)
        self._what = what  # for the log line: whose first call could not start dpobs
        self._given = telemetry
        self._given_pid = os.getpid()
        self._lock = threading.Lock()
        self._pid = None
        self._adapter = None
        self._tel = None
        self.started = None  # the Telemetry this object started, if any
        # The adapter once built in this process (None: dpobs off), else UNBUILT: an op's
        # wrapper reads it with no call at all and calls adapter() only while UNBUILT. A
        # forked child starts UNBUILT again (_forget_in_child).
        self.current = UNBUILT
        _LIVE.add(self)

    def telemetry(self):
        """This process's Telemetry (started on first use), or None if it cannot start."""
        return None if self.adapter() is None else self._tel

    def adapter(self):
        if self._pid == os.getpid():
            return self._adapter
        with self._lock:
            if self._pid != os.getpid():
                self._adapter = self._build()
                self._pid = os.getpid()
                self.current = self._adapter
        return self._adapter

    def _build(self):
        try:
            tel = self._given if os.getpid() == self._given_pid else None
            if tel is None:
                tel = self.started = _SHARED.take(
                    self, self._defaults() if self._defaults is not None else None)
            if not tel.enabled:  # switched off: every call goes to the library, unmeasured
                return None
            self._tel = tel
            return self._build_adapter(tel)
        except Exception:
            log.exception("dpobs: could not start on %s's first call in pid %d; its calls run "
                          "unmeasured", self._what, os.getpid())
            return None

    def close(self) -> None:
        if self.started is not None and self._pid == os.getpid():
            _SHARED.release(self)
        self.started = self._adapter = self._pid = self._tel = None
        self.current = UNBUILT
