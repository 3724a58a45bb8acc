"""The threads the guard's fingerprints run on.

The core hands the guard's hooks (before_put, after_get) to a few helper threads of its own
and waits for them, or, for a store that overlaps them with its own I/O
(protocol.OverlapsGuard), does not wait until the store needs the digests. Each helper limits
OpenMP to one thread *for itself* (an OpenMP setting is per calling thread; the caller's and
everyone else's stay as they were), so the kernels' ops can be SERIAL_FACTOR times larger
without ever going parallel, which is faster even on two cores (docs/development/performance.md).

A hook spreads its chunks over as many threads as its caller has torch intra-op threads
(`width()`, at most sums.MAX_WORKERS): itself and members of a second crew of such helpers
(`share`), so that a put or get uses the cores the caller's own torch ops would.

Tensors on an accelerator are fingerprinted on the calling thread: there the hooks run on
the caller's current stream, ordered after the kernels that wrote the tensors.
"""
from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ..shims import torch_jagged

__all__ = ["run", "submit", "share", "spread", "width", "on_cpu", "pool", "serial_here",
           "WORKERS", "CREW", "SPREAD_MIN_BYTES"]

WORKERS = 4  # puts and gets fingerprinted at once
# A hook whose tensors hold fewer bytes than this runs on its one helper, not spread: handing
# small fields to more threads costs more than a second core gives back (docs/development/performance.md,
# "The wire guard": a 0.5 MB TransferQueue batch fingerprints faster on one thread).
SPREAD_MIN_BYTES = 8 << 20
CREW = 7  # helpers that share a hook's chunks (sums.MAX_WORKERS caps how many one hook asks)
_pools: dict[str, tuple[int, ThreadPoolExecutor]] = {}  # name -> (pid, pool): a fork remakes
_lock = threading.Lock()
_caller = threading.local()  # on a hook's helper: the caller's intra-op thread count


def _after_fork_in_child() -> None:
    global _lock
    _pools.clear()
    _lock = threading.Lock()  # a parent's thread may have held it


os.register_at_fork(after_in_child=_after_fork_in_child)


def serial_here() -> bool:
    """Limit OpenMP to one thread for the calling thread alone (an OpenMP thread count is
    per calling thread), so that torch.get_num_threads() is 1 here: the chunks are then
    SERIAL_FACTOR times larger and no op goes parallel. For the guard's own helper threads,
    never a caller's. False where torch's OpenMP library is not found."""
    torch.get_num_threads()  # torch's lazy per-thread set-up first: it would undo ours
    lib = _openmp()
    if lib is None:
        return False
    lib.omp_set_num_threads(1)
    return torch.get_num_threads() == 1


@functools.lru_cache(maxsize=1)
def _openmp():
    """The OpenMP runtime torch loaded (its wheels ship libgomp, or Intel's libiomp5)."""
    import ctypes
    import glob

    here = os.path.join(os.path.dirname(torch.__file__), "lib")
    for pattern in ("libgomp*.so*", "libiomp5*.so*"):
        for path in sorted(glob.glob(os.path.join(here, pattern))):
            try:
                return ctypes.CDLL(path)  # already loaded by torch: the same handle
            except OSError:
                continue
    return None


def _one_openmp_thread() -> None:
    try:
        serial_here()
    except Exception:  # an initializer that raises would break the pool: run as we are
        pass


def _named(name: str, size: int) -> ThreadPoolExecutor:
    """A pool of helpers, started on first use; a forked child, which inherits none, gets
    its own."""
    with _lock:
        got = _pools.get(name)
        if got is None or got[0] != os.getpid():
            got = _pools[name] = (os.getpid(), ThreadPoolExecutor(
                size, name, initializer=_one_openmp_thread))
        return got[1]


def pool() -> ThreadPoolExecutor:
    """The helpers the hooks run on."""
    return _named("dpobs-guard", WORKERS)


def width() -> int:
    """Threads a hook may spread its work over: on a hook's helper, its caller's torch
    intra-op thread count; anywhere else this thread's own."""
    return getattr(_caller, "threads", None) or torch.get_num_threads()


def _as_caller(threads: int, fn, *args):
    _caller.threads = threads
    try:
        return fn(*args)
    finally:
        _caller.threads = None


def on_cpu(value) -> bool:
    """Are all of a TensorDict's tensors on the CPU (anything else: no)?"""
    try:
        return all(torch_jagged.device(v).type == "cpu" for v in value.values(True, True)
                   if isinstance(v, torch.Tensor))
    except Exception:
        return False


def submit(fn, *args, where=None) -> Future:
    """fn(*args) on a helper when `where` (the tensors it reads) is on the CPU, else done
    here at once; a Future either way. fn must not raise (the core's _guarded does not)."""
    if on_cpu(where):
        try:
            return pool().submit(_as_caller, torch.get_num_threads(), fn, *args)
        except RuntimeError:  # the interpreter is shutting down: no new threads
            pass
    done = Future()
    done.set_result(fn(*args))
    return done


def run(fn, *args, where=None):
    """fn(*args), on a helper when `where` is on the CPU, waiting for it."""
    return submit(fn, *args, where=where).result()


def share(work, threads: int) -> None:
    """work() here and on up to threads - 1 crew helpers at once; returns when every call
    that started has returned. `work` takes its items from a counter it shares with the
    others, so a helper that starts late (the crew busy with another hook) finds none left,
    and one that has not started by then is cancelled, never waited for: no hook waits on a
    crew that is serving another, and the crew never waits on anything."""
    extra = []
    for _ in range(max(0, min(threads, CREW + 1) - 1)):
        try:
            extra.append(_named("dpobs-guard-crew", CREW).submit(work))
        except RuntimeError:  # shutting down: the caller does it alone
            break
    try:
        work()
    finally:
        for f in extra:
            if not f.cancel():
                f.result()


def spread(fn, items: list, threads: int | None = None) -> list:
    """[fn(x) for x in items], the calls spread over `threads` (default: width()) threads
    through share(); items are taken in order, so put the longest first. fn's first
    exception is re-raised here once every started call has returned."""
    out: list = [None] * len(items)
    counter = iter(range(len(items)))  # next() on it is atomic under the GIL
    errors: list[BaseException] = []

    def work() -> None:
        for i in counter:
            if errors:
                return
            try:
                out[i] = fn(items[i])
            except BaseException as e:
                errors.append(e)

    share(work, min(len(items), threads or width()))
    if errors:
        raise errors[0]
    return out
