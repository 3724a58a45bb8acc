"""How the sender's fingerprints of one sync (its manifest) reach every receiver, and how a
receiver checks what it got against them.

A manifest is UTF-8 JSON ({"format", "version", "sender", "tensors": {name: digest}}), about
30 bytes per weight.

Out of band (the default): the sender posts it in the job's own control store, which every
process of the job already reaches and no program reads under dpobs's keys, and each receiver
reads it there after its stream ended, so no program sees a byte of it:

    Ray          the cluster's internal key-value store (the GCS), namespace "dpobs", keys
                 weights/<job>/<Ray job id>/<version>/<sender>: every driver and actor of
                 the Ray job reaches it, whichever process group its weights move over
    torch        the default process group's store (the c10d TCPStore or FileStore every
                 rank rendezvoused through), keys dpobs/weights/<job>/<version>/<n>, n a
                 slot the store's atomic add hands out (a c10d store cannot list keys)

Ray first: under Ray (verl, OpenRLHF, NeMo-RL) the trainers' and the rollouts' process groups
are different groups, while the Ray job is one. Neither is imported here: a store counts only
when the program itself runs Ray or a process group. A sender keeps its last KEEP versions
posted and deletes the older ones, so the store does not grow with the run. One thread per
process (Carriage) makes every store call, never the program's: a sync is recorded when its
stream ends and its check counts once the manifest has been read (usually milliseconds later:
the sender's post races the receiver's last tensor). A receiver waits at most `wait_s` for
it, then counts its tensors unchecked with a reason (meter.UNCHECKED_REASONS), never as a
mismatch and never as an error of the program: `no_store` (this process runs neither Ray nor
a process group), `no_manifest` (nothing posted in time: the sender's guard is off, it runs
without dpobs, or the store is slow or full), `store_error` (the store refused a read: down).
A receiver's sync is checked against the manifests of its version that share a tensor name
with what it received (its sender's; all of them when it received nothing), each sender's
latest post.

In band only when asked (the setting weights_in_band, for transports whose processes share no
store): the manifest is one more (name, tensor) item of the sync, named MANIFEST_NAME, a flat
uint8 tensor, which goes wherever the weights go and which the receiving wrapper takes out
before the engine sees it. uint8 so that a transport that buckets tensors by dtype gives it a
bucket of its own instead of a cast; one that casts every tensor to one dtype would corrupt
it, and the receiver then counts an internal error and checks nothing.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
import uuid
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from time import monotonic
from typing import TYPE_CHECKING

from .. import names

if TYPE_CHECKING:
    import torch

log = logging.getLogger("dpobs_otel")

MANIFEST_NAME = "dpobs.weights.fingerprints"
FORMAT = "dpobs-weights/1"
NAMESPACE = "dpobs"  # Ray's internal KV
KEEP = 4  # versions a sender keeps posted: a receiver may lag a few (async RL)
WAIT_S = 30.0  # how long a receiver's check waits for its sender's manifest
FIRST_POLL_S, LAST_POLL_S = 0.001, 0.1  # between two reads of the store, doubling
EXIT_S = 5.0  # at interpreter exit, for a sender's last posts (its thread is a daemon)


def dumps(version: int, digests: dict[str, int], sender: str = "") -> bytes:
    doc = {"format": FORMAT, "version": int(version), "sender": sender, "tensors": digests}
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def loads(data: bytes) -> tuple[int, dict[str, int], str]:
    """(version, {name: digest}, sender); ValueError for anything that is not a manifest."""
    doc = json.loads(bytes(data).decode("utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("not a dpobs weights manifest")
    tensors = doc["tensors"]
    return (int(doc["version"]), {str(k): int(v) for k, v in tensors.items()},
            str(doc.get("sender", "")))


def encode(version: int, digests: dict[str, int]) -> torch.Tensor:
    """The in-band item's tensor."""
    import torch  # here, not above: every dpobs.start() imports this module (tel.weights)
    return torch.frombuffer(bytearray(dumps(version, digests)), dtype=torch.uint8)


def decode(tensor: torch.Tensor) -> tuple[int, dict[str, int]]:
    """(version, {name: digest}) of an in-band item's tensor."""
    import torch
    raw = tensor.detach().to("cpu").contiguous().reshape(-1)
    if raw.dtype != torch.uint8:
        raise ValueError(f"a weights manifest is uint8, got {raw.dtype}")
    version, digests, _ = loads(raw.numpy().tobytes())
    return version, digests


@dataclass
class Check:
    """One receiver's check of one sync: every name either side knows, looked at once."""
    checked: int = 0
    mismatched: dict[str, int] = field(default_factory=dict)  # reason -> tensors
    names: dict[str, list[str]] = field(default_factory=dict)  # reason -> a few names


def compare(sent: dict[str, int], received: dict[str, int], keep: int = 5) -> Check:
    out = Check(checked=len(sent.keys() | received.keys()))
    reasons = {
        "value": [n for n, d in received.items() if n in sent and sent[n] != d],
        "missing": [n for n in sent if n not in received],
        "unexpected": [n for n in received if n not in sent],
    }
    for reason, bad in reasons.items():
        if bad:
            out.mismatched[reason] = len(bad)
            out.names[reason] = sorted(bad)[:keep]
    return out


def report(version: int, check: Check) -> None:
    """The first few names of each reason, in the process's log."""
    if check.mismatched:
        log.error("dpobs: weights version %s differ from the sender's (%s): %s",
                  version, names.WEIGHTS_MISMATCHED_SERIES,
                  {r: check.names[r] for r in check.mismatched})


# -- the stores -----------------------------------------------------------------------------
def find(job: str):
    """The board of this process's job, or None when it runs neither Ray nor a group."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return RayBoard(job, ray)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        from torch.distributed.distributed_c10d import _get_default_store
        return C10dBoard(job, _get_default_store())
    return None


class C10dBoard:
    def __init__(self, job: str, store):
        self.store, self.prefix = store, f"dpobs/weights/{job}/"

    def post(self, version: int, data: bytes, sender: str = "") -> list[str]:
        """Post one manifest (its sender is inside it); the keys to delete once it is old."""
        base = f"{self.prefix}{version}/"
        key = f"{base}{self.store.add(base + 'n', 1)}"
        self.store.set(key, data)
        return [key, base + "n"]

    def read(self, version: int) -> list[bytes]:
        """Every manifest posted for `version` so far, in posting order."""
        base = f"{self.prefix}{version}/"
        if not self.store.check([base + "n"]):
            return []
        keys = [f"{base}{i}" for i in range(1, int(self.store.get(base + "n")) + 1)]
        return [self.store.get(k) for k in keys if self.store.check([k])]

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            self.store.delete_key(key)


class RayBoard:
    def __init__(self, job: str, ray):
        from ray.experimental import internal_kv
        self.kv = internal_kv
        self.prefix = f"weights/{job}/{ray.get_runtime_context().get_job_id()}/"

    def post(self, version: int, data: bytes, sender: str = "") -> list[bytes]:
        key = f"{self.prefix}{version}/{sender}".encode()
        self.kv._internal_kv_put(key, data, overwrite=True, namespace=NAMESPACE)
        return [key]

    def read(self, version: int) -> list[bytes]:
        keys = self.kv._internal_kv_list(f"{self.prefix}{version}/", namespace=NAMESPACE)
        found = (self.kv._internal_kv_get(k, namespace=NAMESPACE) for k in sorted(keys))
        return [v for v in found if v is not None]

    def delete(self, keys: list[bytes]) -> None:
        for key in keys:
            self.kv._internal_kv_del(key, namespace=NAMESPACE)


class Posted:
    """A sender's posted versions, oldest first: what to delete once KEEP newer ones exist."""

    def __init__(self):
        self._keys: OrderedDict = OrderedDict()  # version -> [(board, keys)]

    def add(self, version: int, board, keys) -> list:
        """Record one post; return the (board, keys) now too old to keep."""
        self._keys.setdefault(version, []).append((board, keys))
        self._keys.move_to_end(version)
        old = []
        while len(self._keys) > KEEP:
            old.extend(self._keys.popitem(last=False)[1])
        return old


# -- the carriage ---------------------------------------------------------------------------
class _Pending:
    """One receiver's sync waiting for its manifest."""

    def __init__(self, board, version: int, digests: dict, wait_s: float):
        self.board, self.version, self.digests = board, version, digests
        self.deadline = monotonic() + wait_s
        self.next_at, self.delay = 0.0, FIRST_POLL_S


def expected_of(posted: list[bytes], received: dict) -> dict | None:
    """The digests `received` is checked against, or None while no post is its sender's."""
    latest = {}
    for data in posted:
        _, tensors, sender = loads(data)
        latest[sender] = tensors  # posted in order: a re-sync of a version replaces it
    mine = [t for t in latest.values() if not received or t.keys() & received.keys()]
    if not mine:
        return None
    out: dict = {}
    for tensors in mine:
        out.update(tensors)
    return out


class Carriage:
    """Made by Weights with the guard on: out of band it posts and checks through the store;
    in band it only counts a receiver that got no manifest item (`unchecked`)."""

    def __init__(self, weights, job: str, wait_s: float = WAIT_S):
        self.weights, self.job, self.wait_s = weights, job, wait_s
        self.sender = uuid.uuid4().hex  # this process's sends, among the job's senders
        self._cv = threading.Condition()
        self._todo: deque = deque()
        self._open = 0  # submitted, not yet done
        self._pid = None
        self._posted = Posted()
        self._said: set[str] = set()
        atexit.register(_settle_at_exit, weakref.ref(self))

    # -- the program's threads (Sync.end) ------------------------------------------------
    def post(self, version: int, digests: dict) -> None:
        board = find(self.job)
        if board is None:
            self._say("no_store", "dpobs: no Ray and no torch.distributed group here: the "
                      "weights' fingerprints have no store to travel through, receivers "
                      "count them unchecked (DPOBS_WEIGHTS_IN_BAND=1 carries them in band)")
            return
        data = dumps(version, digests, self.sender)
        self._submit(lambda: self._post(board, version, data))

    def check(self, version: int, digests: dict) -> None:
        try:
            board = find(self.job)
        except Exception as exc:
            return self.unchecked("store_error", len(digests), exc)
        if board is None:
            return self.unchecked("no_store", len(digests))
        self._submit(_Pending(board, version, dict(digests), self.wait_s))

    def settle(self, timeout: float) -> bool:
        """Wait until every post and check submitted so far is done; False on timeout."""
        end = monotonic() + timeout
        with self._cv:
            while self._open:
                left = end - monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    # -- this module's thread -------------------------------------------------------------
    def _submit(self, item) -> None:
        with self._cv:
            if self._pid != os.getpid():  # first use, or a forked child: a thread of its own
                self._pid = os.getpid()
                self._todo.clear()
                self._open = 0
                threading.Thread(target=self._run, name="dpobs-weights-proof",
                                 daemon=True).start()
            self._todo.append(item)
            self._open += 1
            self._cv.notify_all()

    def _run(self) -> None:
        pending: list[_Pending] = []
        while True:
            with self._cv:
                while not self._todo and not pending:
                    self._cv.wait()
                todo = list(self._todo)
                self._todo.clear()
            done = 0
            for item in todo:
                if isinstance(item, _Pending):
                    pending.append(item)
                else:
                    self._guarded(item)
                    done += 1
            now = monotonic()
            waiting = [p for p in pending if p.next_at > now or not self._attempt(p, now)]
            done += len(pending) - len(waiting)
            pending = waiting
            with self._cv:
                self._open -= done
                self._cv.notify_all()
                if pending and not self._todo:
                    self._cv.wait(max(0.0, min(p.next_at for p in pending) - monotonic()))

    def _guarded(self, fn) -> None:
        try:
            fn()
        except Exception as exc:
            self.weights.internal_error(exc)

    def _post(self, board, version: int, data: bytes) -> None:
        keys = board.post(version, data, self.sender)
        for old_board, old_keys in self._posted.add(version, board, keys):
            self._guarded(lambda: old_board.delete(old_keys))

    def _attempt(self, p: _Pending, now: float) -> bool:
        """One read of the store for `p`; True when it is done (checked or unchecked)."""
        try:
            posted = p.board.read(p.version)
        except Exception as exc:
            self.unchecked("store_error", len(p.digests), exc)
            return True
        try:
            expected = expected_of(posted, p.digests)
            if expected is not None:
                self.weights.checked(p.version, compare(expected, p.digests))
                return True
        except Exception as exc:  # a post that is no manifest, dpobs's own bookkeeping
            self.weights.internal_error(exc)
            return True
        if now >= p.deadline:
            self.unchecked("no_manifest", len(p.digests))
            return True
        p.next_at, p.delay = now + p.delay, min(2 * p.delay, LAST_POLL_S)
        return False

    def unchecked(self, reason: str, tensors: int, exc: BaseException | None = None) -> None:
        self.weights.meter.add_unchecked(reason, tensors)
        self._say(reason, f"dpobs: weights left unchecked ({reason}"
                  + (f": {type(exc).__name__}: {exc}" if exc is not None else "") + ")")

    def _say(self, reason: str, text: str) -> None:
        if reason not in self._said:  # once per reason and process: a log line, not a flood
            self._said.add(reason)
            log.warning(text)


def _settle_at_exit(ref) -> None:
    """A trainer that exits right after its last sync still posts it."""
    carriage = ref()
    if carriage is not None and carriage._pid == os.getpid():
        carriage.settle(EXIT_S)
