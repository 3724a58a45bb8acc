"""torch.distributed calls made inside a `tel.weights.sync()` block, on its thread, counted
for that sync: the tensors broadcast, sent, received or gathered (bytes and tensors, each
tensor once per sync). Installed the first time a sync block opens in a process (never when
dpobs is off), on the `torch.distributed` module's attributes, so code that calls
`dist.broadcast(...)` is seen and code that bound the function before is not. Outside a
block the wrappers call straight through; inside one they count, then call, and the call's
result and errors are the caller's, unchanged.
"""
from __future__ import annotations

import functools
import threading

from .sync import current

_LOCK = threading.Lock()
_INSTALLED = False


def _first(args, kwargs, key):
    return kwargs[key] if key in kwargs else (args[0] if args else None)


# name -> the tensors one call moves for this process (its arguments as the call takes them)
TENSORS = {
    "broadcast": lambda a, k: [_first(a, k, "tensor")],
    "send": lambda a, k: [_first(a, k, "tensor")],
    "recv": lambda a, k: [_first(a, k, "tensor")],
    "isend": lambda a, k: [_first(a, k, "tensor")],
    "irecv": lambda a, k: [_first(a, k, "tensor")],
    "all_gather": lambda a, k: list(_first(a, k, "tensor_list") or ()),
}


def _wrap(fn, tensors_of):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        sync = current()
        if sync is not None:
            try:
                moved = tensors_of(args, kwargs)
            except Exception:  # arguments the call itself will reject: let it say so
                moved = ()
            for t in moved:
                if t is not None:
                    sync.counted(t)
        return fn(*args, **kwargs)
    call.__dpobs_wrapped__ = fn
    return call


def install() -> None:
    global _INSTALLED
    if _INSTALLED:
        return
    with _LOCK:
        if _INSTALLED:
            return
        import torch.distributed as dist
        for name, tensors_of in TENSORS.items():
            fn = getattr(dist, name, None)
            if fn is not None and not hasattr(fn, "__dpobs_wrapped__"):
                setattr(dist, name, _wrap(fn, tensors_of))
        _INSTALLED = True
