"""Transfer-engine calls made inside a `tel.weights.sync()` block, on its thread, counted for
that sync with their exact bytes: Mooncake's TransferEngine (`mooncake.engine`) and NIXL's
agent (`nixl_agent` of the nixl / nixl_cu12 / nixl_cu13 wheels), for code that moves weights
through them directly, as verl's mooncake and nixl checkpoint engines and NeMo-RL's NIXL
path do.

Both engines are one-sided: only the process that makes the call (the writer of a WRITE, the
reader of a READ) sees a transfer, so only its side's sync counts it; the passive side counts
what it note()s. A transfer counts its local regions (address, length), each one tensor, once
it succeeded (Mooncake: returned 0; NIXL: posted without "ERR"). A transfer and a note() of
the same live tensor pair up and count once (fingerprinted, then transferred, or the reverse),
while a staging buffer a sync transfers again (refilled in between) counts again.

Installed on the engines' classes, never importing one: an engine counts only once the user's
code has imported it, from the first `tel.weights.sync()` (and dpobs.start()) after that, and
never when dpobs is off. A NIXL transfer request made before then is not known here and is
not counted. The wrapped calls' results and exceptions are the caller's, unchanged; dpobs's
own errors are swallowed and counted (component "weights").
"""
from __future__ import annotations

import functools
import sys
import threading

from .sync import current

_LOCK = threading.Lock()
_DONE: set[str] = set()  # the modules whose classes are wrapped
_KNOWN_MAX = 1 << 16  # NIXL requests remembered (oldest dropped): a bound on what leaks
_ON_ERROR: list = []  # the internal_error of the Weights that installed last


def count(sync, regions) -> None:
    """The (address, length) regions one successful transfer moved from this process: each
    pairs with a note() of the same live tensor, one with one, as a collective does
    (sync.Seen); a region transferred again (a refilled staging buffer) counts again."""
    try:
        sync.begin()
        for address, length in regions:
            sync.region(address, length)
    except Exception as exc:
        sync.owner.internal_error(exc)


def _arg(args, kwargs, index: int, name: str):
    """The bound method's argument `name` (positional `index` after self)."""
    return kwargs[name] if name in kwargs else args[index]


def _wrap(cls, name: str, regions, ok) -> None:
    """cls.name counts `regions(args, kwargs)` into the open sync when ok(its result)."""
    fn = cls.__dict__.get(name)
    if fn is None or hasattr(fn, "__dpobs_wrapped__"):
        return

    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        result = fn(self, *args, **kwargs)
        sync = current()
        if sync is not None:
            try:
                if ok(result):
                    count(sync, regions(self, args, kwargs))
            except Exception as exc:
                sync.owner.internal_error(exc)
        return result
    call.__dpobs_wrapped__ = fn
    setattr(cls, name, call)


# -- Mooncake TransferEngine ----------------------------------------------------------------
def _one(self, args, kwargs):
    return [(_arg(args, kwargs, 1, "buffer"), _arg(args, kwargs, 3, "length"))]


def _batch(self, args, kwargs):
    return list(zip(_arg(args, kwargs, 1, "buffers"), _arg(args, kwargs, 3, "lengths")))


MOONCAKE = {"transfer_sync_write": _one, "transfer_sync_read": _one, "transfer_sync": _one,
            "batch_transfer_sync_write": _batch, "batch_transfer_sync_read": _batch,
            "batch_transfer_sync": _batch}


def _mooncake(module) -> None:
    for name, regions in MOONCAKE.items():
        _wrap(module.TransferEngine, name, regions, lambda rc: rc == 0)


# -- NIXL -----------------------------------------------------------------------------------
class _Requests:
    """What each NIXL transfer request moves from local memory, recorded when the request is
    made (cheaply: the descriptor list and indices, read only when a sync counts a post)."""

    def __init__(self):
        self.requests: dict[int, tuple] = {}  # request -> (descriptor list, indices | None)
        self.lists: dict[int, tuple] = {}  # local prepared list -> (xfer_list, mem_type)

    @staticmethod
    def _keep(table: dict, key, value) -> None:
        table[key] = value
        if len(table) > _KNOWN_MAX:
            table.pop(next(iter(table)))

    def regions(self, agent, handle) -> list:
        descs, indices = self.requests.get(handle._handle, (None, None))
        if descs is None:
            return []  # made before dpobs wrapped NIXL: unknown
        if indices is not None:  # a prepared request: its local list, the chosen entries
            descs = agent.get_xfer_descs(*descs)
            return [descs[int(i)][:2] for i in indices]
        return [descs[i][:2] for i in range(descs.descCount())]


def _recorded(fn, record):
    """fn, its result (a handle) recorded by record(self, result, args, kwargs) first."""
    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        handle = fn(self, *args, **kwargs)
        try:
            record(self, handle, args, kwargs)
        except Exception as exc:
            _internal_error(exc)
        return handle
    call.__dpobs_wrapped__ = fn
    return call


def _internal_error(exc) -> None:
    # No sync is open while a request is made: the telemetry that last opened one counts it.
    if _ON_ERROR:
        _ON_ERROR[0](exc)


def _nixl(module) -> None:
    cls, known = module.nixl_agent, _Requests()

    def made(self, handle, args, kwargs):
        known._keep(known.requests, handle._handle, (_arg(args, kwargs, 1, "local_descs"), None))

    def prepared(self, handle, args, kwargs):
        if _arg(args, kwargs, 0, "agent_name") in ("NIXL_INIT_AGENT", ""):
            xfer_list = _arg(args, kwargs, 1, "xfer_list")
            mem_type = kwargs.get("mem_type", args[2] if len(args) > 2 else None)
            known._keep(known.lists, handle._handle, (xfer_list, mem_type))

    def made_prepared(self, handle, args, kwargs):
        local = known.lists.get(_arg(args, kwargs, 1, "local_xfer_side")._handle)
        if local is not None:
            indices = list(_arg(args, kwargs, 2, "local_indices"))
            known._keep(known.requests, handle._handle, (local, indices))

    for name, record in (("initialize_xfer", made), ("prep_xfer_dlist", prepared),
                         ("make_prepped_xfer", made_prepared)):
        fn = cls.__dict__.get(name)
        if fn is not None and not hasattr(fn, "__dpobs_wrapped__"):
            setattr(cls, name, _recorded(fn, record))
    _wrap(cls, "transfer", lambda self, a, k: known.regions(self, _arg(a, k, 0, "handle")),
          lambda state: state != "ERR")


# module -> how its classes are wrapped; only modules the user's code imported
ENGINES = {"mooncake.engine": _mooncake, "nixl._api": _nixl, "nixl_cu12._api": _nixl,
           "nixl_cu13._api": _nixl}


def install(on_error) -> None:
    """Wrap every engine imported so far (cheap when none is new: a sync block calls it);
    on_error(exc) counts dpobs's errors made outside a sync."""
    _ON_ERROR[:] = [on_error]
    if _DONE.issuperset(ENGINES):
        return
    with _LOCK:
        for name, wrap in ENGINES.items():
            module = sys.modules.get(name)
            if module is not None and name not in _DONE:
                _DONE.add(name)  # once, even if it fails: the failure is counted once
                wrap(module)
