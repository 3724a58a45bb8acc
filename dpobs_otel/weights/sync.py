"""One side of one weight sync: the tensors it moved, its wall time, and (guard on) the
fingerprints the sender posts (out of band, carriage.py) or sends (in band), and the
receiver checks.

Every method a user's transfer loop calls (note, manifest, the collectives' hook) swallows
and counts its own errors: a sync is measured or, failing that, left alone, never failed.
"""
from __future__ import annotations

import logging
import threading
import weakref
from time import perf_counter

from . import manifest

log = logging.getLogger("dpobs_otel")
_CURRENT = threading.local()  # the sync block open on this thread (torch.distributed's hook)


def fingerprint(name: str, tensor):
    """The tensor's digest: an int, or for an accelerator's tensor one left on its device
    (no host sync per tensor), which settled() brings back with the sync's others."""
    # Imported here: the guard's code (and its C kernel) loads only in a process that proves.
    from .fingerprint import pending
    return pending(name, tensor)


def settled(digests: dict) -> dict[str, int]:
    from .fingerprint import settle
    return settle(digests)


def current() -> "Sync | None":
    return getattr(_CURRENT, "sync", None)


class Seen:
    """The memory a sync counted, by (address, bytes), so that one tensor noted and moved by
    a collective (note then broadcast on a sender, receive then note on a receiver) counts
    once: a note and a collective pair up, one with one. A second collective on the same
    memory (a receive buffer reused for the next tensor) or a second note counts again. Each
    key keeps a weak reference to the tensor that held it: a stream that drops each tensor
    once sent lets the next one of the same size reuse its memory, and that one is new."""

    def __init__(self):
        self._held: dict[tuple[int, int], tuple[object, str | None]] = {}

    def first(self, key, tensor, kind: str) -> bool:
        """True when this (kind: "note" or "moved") counts; False when it pairs with the
        other kind's last count of the same live tensor's memory."""
        ref, last = self._held.get(key, (None, None))
        if last not in (None, kind) and ref is not None and ref() is not None:
            self._held[key] = (ref, None)  # paired: the next of either kind counts
            return False
        self._held[key] = (_weak(tensor), kind)
        return True


def _ALIVE():
    return True


def _weak(tensor):
    try:
        return weakref.ref(tensor)
    except TypeError:  # not weakly referenceable: taken as alive for the sync
        return _ALIVE


def _is_manifest(name) -> bool:
    return isinstance(name, str) and name == manifest.MANIFEST_NAME


class Sync:
    """Made by tel.weights.sync(); `with` it, or begin() and end() (the stream wrappers)."""

    def __init__(self, owner, version: int, side: str):
        self.owner, self.version, self.side = owner, version, side
        self.prove, self.in_band = owner.prove, owner.in_band
        self.streamed = False  # a stream wrapper's sync: proven even when it moved nothing
        self.bytes = self.tensors = 0
        self.digests: dict[str, int] = {}  # name -> fingerprint of what passed here
        self.expected: dict[str, int] | None = None  # receiver: the sender's manifest
        self._seen = Seen()  # a tensor counts once
        self._t0 = None
        self._outer = None
        self.check = None  # the receiver's manifest.Check, once ended

    # -- the block ------------------------------------------------------------------------
    def __enter__(self) -> "Sync":
        self.begin()
        self._outer = current()
        _CURRENT.sync = self
        return self

    def __exit__(self, *exc) -> None:
        _CURRENT.sync = self._outer
        self.end()

    def begin(self) -> None:
        if self._t0 is None:
            self._t0 = perf_counter()

    def end(self) -> None:
        if self._t0 is None:
            return
        t0, self._t0 = self._t0, None
        t1 = perf_counter()
        try:
            if self.prove:
                self.digests = settled(self.digests)  # one transfer per device for the sync
            if self.side == "receive" and self.prove and self.expected is not None:
                self.check = manifest.compare(self.expected, self.digests)  # in band: now
                manifest.report(self.version, self.check)
            self.owner.done(self, t0, t1)
            if self.prove and self.check is None and (self.streamed or self.digests):
                self.owner.prove_later(self)  # a block that noted nothing has no proof
        except Exception as exc:
            self.owner.internal_error(exc)

    # -- what passes ----------------------------------------------------------------------
    def note(self, name: str, tensor) -> None:
        """One (name, tensor) of this sync. On the receiving side the sender's manifest item
        is taken as the fingerprints, not as a weight."""
        try:
            self.begin()
            if self.side == "receive" and _is_manifest(name):
                self._take_manifest(tensor)
                return
            self._count(tensor, "note")
            if self.prove:
                self.digests[name] = fingerprint(name, tensor)
        except Exception as exc:
            self.owner.internal_error(exc)

    def note_item(self, item) -> bool:
        """note() for one item of a stream; True when it is the manifest (the receiving
        wrapper drops it)."""
        try:
            name, tensor = item
        except (TypeError, ValueError):
            return False
        is_manifest = self.side == "receive" and _is_manifest(name)
        self.note(name, tensor)
        return is_manifest

    def counted(self, tensor) -> None:
        """A tensor a torch.distributed call moved on this thread: bytes and a tensor, unless
        it pairs with a note of the same tensor (Seen; no fingerprint: it has no name)."""
        try:
            self.begin()
            self._count(tensor, "moved")
        except Exception as exc:
            self.owner.internal_error(exc)

    def region(self, address: int, length: int) -> None:
        """Memory a transfer engine moved on this thread (transfers.py): one tensor of
        `length` bytes, paired with a note of the same live tensor as a collective's is.
        Raises: its caller counts the error once per transfer."""
        self._add((int(address), int(length)), None, "moved")

    def _count(self, tensor, kind: str) -> None:
        nbytes = tensor.numel() * tensor.element_size()  # t.contiguous().nbytes, no copy
        self._add((tensor.data_ptr(), nbytes), tensor, kind)

    def _add(self, key: tuple[int, int], tensor, kind: str) -> None:
        if self._seen.first(key, tensor, kind):  # tensor None: held for the sync
            self.bytes += key[1]
            self.tensors += 1

    def manifest(self):
        """In band (the setting weights_in_band): the sender's fingerprints as one (name,
        tensor) item to send after the weights, over the same transport, to every receiver;
        the stream wrapper sends it by itself. None otherwise: with the guard off there is
        nothing to send, and out of band (the default) the sync posts them when it ends."""
        if self.side != "send" or not self.prove or not self.in_band:
            return None
        try:
            self.digests = settled(self.digests)
            return manifest.MANIFEST_NAME, manifest.encode(self.version, dict(self.digests))
        except Exception as exc:
            self.owner.internal_error(exc)
            return None

    def _take_manifest(self, tensor) -> None:
        version, digests = manifest.decode(tensor)
        if version != self.version:  # the sender's step is the truth; say so once
            log.warning("dpobs: weights manifest for version %s received in a sync marked %s",
                        version, self.version)
        self.expected = digests
