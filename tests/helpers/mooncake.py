"""What the live Mooncake tests (tests/adapters/mooncake/) share besides their fixtures (in
that folder's conftest.py): series names, rows, a store that blinks, the workers that
spawned processes run (importable there by name: spawn children get the parent's sys.path),
and the sockets a process listens on. Importing it skips the importing test module when, and
only when, the mooncake wheel is not installed (`pip install mooncake-transfer-engine-non-cuda`, which
`make` does); an installed wheel that fails to import (e.g. libibverbs1 missing) fails."""
from __future__ import annotations

import contextlib
import importlib.util
import itertools
import multiprocessing
import os
import urllib.request

import pytest
import torch
from tensordict import TensorDict

if importlib.util.find_spec("mooncake") is None:
    pytest.skip("the mooncake wheel is not installed (pip install mooncake-transfer-engine-non-cuda)",
                allow_module_level=True)

import mooncake.store  # noqa: E402,F401  an installed wheel must import: no skip past here

import dpobs_otel as dpobs  # noqa: E402
from dpobs_otel.adapters.mooncake import MooncakeDataPlane  # noqa: E402
from dpobs_otel.testing.mooncake import connect_store  # noqa: E402
from helpers.rollout import N, PART, payload  # noqa: E402  the guard's GRPO rows

LEASE_MS = 300
IDS = ["a", "b", "c"]
OPS = "dpobs_client_operation_duration_seconds_count"
BYTES = "dpobs_client_transferred_bytes_total"
KEYS = "dpobs_client_keys_total"
ERRORS = "dpobs_client_operation_errors_total"
namespaces = itertools.count()  # a fresh namespace per data plane


def master_keys(master) -> list[str]:
    body = urllib.request.urlopen(master.admin_url + "/get_all_keys", timeout=10).read()
    return [k for k in body.decode().split("\n") if k]


def bits(t: torch.Tensor) -> list:
    return t.contiguous().reshape(-1).view(torch.uint8).tolist() if t.numel() else []


class Blinking:
    """A store whose next answer for `key` reads as absent, as while another client
    upserts it (seen on Mooncake: a key being upserted reads as absent for a moment)."""

    def __init__(self, store, key):
        self._store, self.key, self.blinked = store, key, 0

    def __getattr__(self, name):
        return getattr(self._store, name)

    def _blink(self, keys, out, absent):
        if self.key in keys and not self.blinked:
            self.blinked += 1
            out = list(out)
            out[keys.index(self.key)] = absent
        return out

    def get_batch(self, keys):
        return self._blink(keys, self._store.get_batch(keys), b"")

    def batch_get_tensor(self, keys):
        return self._blink(keys, self._store.batch_get_tensor(keys), None)


def batch_n(n):
    return TensorDict({"x": torch.arange(n * 3, dtype=torch.float32).reshape(n, 3),
                       "tok": torch.nested.nested_tensor([torch.arange(i + 1) for i in range(n)],
                                                         layout=torch.jagged)}, [n])


# -- what spawned workers run ----------------------------------------------------------
_WORKER: dict = {}


def worker_plane(addr):
    """This worker's data plane; its store (and segment) stays up for later calls."""
    if "plane" not in _WORKER:
        _WORKER["plane"] = MooncakeDataPlane(connect_store(*addr, 32 << 20, 32 << 20),
                                             namespace="guard", lease_s=LEASE_MS / 1000)
    return _WORKER["plane"]


def open_plane(addr) -> None:
    worker_plane(addr)


def close_plane() -> None:
    plane = _WORKER.pop("plane", None)
    if plane is not None:
        plane.close()
        plane.store.close()  # unmount the segment now, not a client_ttl after the kill


@contextlib.contextmanager
def workers(n: int):
    """n one-process pools (spawned); each worker's store closed before the pools go."""
    ctx = multiprocessing.get_context("spawn")
    pools = [ctx.Pool(1) for _ in range(n)]
    try:
        yield pools
    finally:
        for p in pools:
            try:
                p.apply(close_plane)
            finally:
                p.terminate()


def guard_counts(tel) -> dict:
    """{recorded|checked|mismatched|unverified: rows over all fields}."""
    return {k: sum(v.values()) for k, v in tel.guard.totals().items()
            if k in ("recorded", "checked", "mismatched", "unverified")}


def write_rows(addr) -> dict:
    tel = dpobs.start(role="rollout", rank=0, port=0, verify_tensor_hash=True)
    try:
        client = tel.instrument(worker_plane(addr))
        client.register_partition(PART)
        client.put_samples([f"uid-{i}" for i in range(N)], PART, payload())
        return guard_counts(tel)
    finally:
        tel.shutdown()


def tamper_row(addr) -> None:
    """A bare client, no guard: flip one bit of one row, keep the writer's digest column."""
    raw = worker_plane(addr)
    row = raw.get_samples(["uid-17"], PART)
    logp = row["logprobs"].clone()
    logp.view(torch.int16)[0, 3] ^= 1
    row.set("logprobs", logp)
    raw.put_samples(["uid-17"], PART, row)


def read_rows(addr) -> dict:
    tel = dpobs.start(role="trainer", rank=1, port=0, verify_tensor_hash=True)
    try:
        client = tel.instrument(worker_plane(addr))
        out = client.get_samples([f"uid-{i}" for i in range(N)][::-1], PART)
        return {"counts": guard_counts(tel), "keys": sorted(out.keys()), "pid": os.getpid()}
    finally:
        tel.shutdown()


def fan_in(addr, w, steps) -> list[str]:
    """One writer of a shared partition: puts 8 rows a step, clears half of every third."""
    plane, live = worker_plane(addr), []
    td = TensorDict({"x": torch.ones(8, 4)}, [8])
    for i in range(steps):
        ids = [f"w{w}-{i}-{j}" for j in range(8)]
        plane.put_samples(ids, "fan-in", td)
        live += ids
        if i % 3 == 2:
            plane.clear_samples(ids[:4], "fan-in")
            live = [sid for sid in live if sid not in ids[:4]]
    return live


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 as /proc has them


def listening(pids) -> dict[int, str]:
    """{port: address} of every TCP socket in LISTEN that these processes hold."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    out = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(path).read().splitlines()[1:]:
            cols = line.split()
            addr, port = cols[1].rsplit(":", 1)
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                out[int(port, 16)] = addr
    return out
