"""The threads the guard's fingerprints run on.

The core hands the guard's hooks (before_put, after_get) to a few helper threads of its own
and waits for them, or, for a store that overlaps them with its own I/O
(protocol.OverlapsGuard), does not wait until the store needs the digests. Each helper limits
OpenMP to one thread *for itself* (an OpenMP setting is per calling thread; the caller's and
everyone else's stay as they were), so the kernels' ops can be SERIAL_FACTOR times larger
without ever going parallel, which is faster even on two cores (docs/performance.md).

Tensors on an accelerator are fingerprinted on the calling thread: there the hooks run on
the caller's current stream, ordered after the kernels that wrote the tensors.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch

__all__ = ["run", "submit", "on_cpu", "pool", "WORKERS"]

WORKERS = 4  # puts and gets fingerprinted at once (one field's chunks stay on one of them)
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): a fork makes a new one
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _pool, _lock
    _pool, _lock = None, threading.Lock()  # a parent's thread may have held it


os.register_at_fork(after_in_child=_after_fork_in_child)


def _one_openmp_thread() -> None:
    try:
        from .sums import serial_here
        serial_here()
    except Exception:  # an initializer that raises would break the pool: run as we are
        pass


def pool() -> ThreadPoolExecutor:
    """The helpers, started on first use; a forked child, which inherits none, gets its own."""
    global _pool
    with _lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(WORKERS, "dpobs-guard",
                                                     initializer=_one_openmp_thread))
        return _pool[1]


def on_cpu(value) -> bool:
    """Are all of a TensorDict's tensors on the CPU (anything else: no)?"""
    try:
        return all(v.device.type == "cpu" for v in value.values(True, True)
                   if isinstance(v, torch.Tensor))
    except Exception:
        return False


def submit(fn, *args, where=None) -> Future:
    """fn(*args) on a helper when `where` (the tensors it reads) is on the CPU, else done
    here at once; a Future either way. fn must not raise (the core's _guarded does not)."""
    if on_cpu(where):
        try:
            return pool().submit(fn, *args)
        except RuntimeError:  # the interpreter is shutting down: no new threads
            pass
    done = Future()
    done.set_result(fn(*args))
    return done


def run(fn, *args, where=None):
    """fn(*args), on a helper when `where` is on the CPU, waiting for it."""
    return submit(fn, *args, where=where).result()
