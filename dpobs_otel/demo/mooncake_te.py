"""The demo's weight transport over Mooncake's TransferEngine (`--weight-sync mooncake`), beside
gloo.py and with its shape: the trainer (rank 0) sends, the rollout (rank 1) receives.

Each process registers one staging pool with its engine. One item is: the sender copies the
tensor into its pool, writes it into the receiver's pool (transfer_sync_write, one-sided),
then sends its header (name, shape, dtype) on a control connection; the receiver copies it out
into a tensor of its own and acknowledges, which frees both pools for the next item. As with
gloo, the items go one at a time because the stream's last item (the guard's fingerprints) is
sized only when the sending wrapper yields it; a None header ends the sync.

Loopback only: the engine runs in P2P-handshake mode (no metadata server; its RPC listener on
127.0.0.1, peers named 127.0.0.1:<port>) over its TCP transport, MC_TCP_BIND_ADDRESS set to
127.0.0.1 so it advertises (and its peer connects to) loopback; the control connection
listens on 127.0.0.1, its port published through the shared Value `port` as gloo's is."""
from __future__ import annotations

import os
import time
from multiprocessing.connection import Client, Listener

import torch

from .gloo import SENDER, TIMEOUT_S

HOST = "127.0.0.1"
POOL = 32 << 20  # bytes: more than the demo model's largest tensor (6.3 MB)


def _control(rank: int, port):
    """The sender listens (its port into `port`), the receiver connects once it has."""
    if rank == SENDER:
        with Listener((HOST, 0)) as listener:
            port.value = listener.address[1]
            return listener.accept()
    deadline = time.monotonic() + TIMEOUT_S
    while port.value == 0:
        if time.monotonic() > deadline:
            raise TimeoutError("the weight sender never published its control port")
        time.sleep(0.01)
    return Client((HOST, port.value))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


class MooncakeTE:
    """One process's end: `send(items)` on the sender, `receive()` on the receiver."""

    def __init__(self, rank: int, world: int, port):
        if world != 2:
            raise ValueError("the mooncake transport pairs one sender with one receiver")
        self.pool = torch.empty(POOL, dtype=torch.uint8)
        self._start()
        self.conn = _control(rank, port)
        if rank == SENDER:
            self._connect(self.conn.recv())
        else:
            self.conn.send(self._address())

    # -- the engine: a subclass drives another one-sided engine the same way ----------------
    def _start(self) -> None:
        """The engine up, the pool registered with it."""
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", HOST)
        from mooncake.engine import TransferEngine  # the demo's optional dependency
        self.te = TransferEngine()
        self._ok(self.te.initialize(HOST, "P2PHANDSHAKE", "tcp", ""), "initialize")
        self._ok(self.te.register_memory(self.pool.data_ptr(), POOL), "register_memory")

    def _address(self):
        """What the sender needs to write into this receiver's pool."""
        return self.te.get_rpc_port(), self.pool.data_ptr()

    def _connect(self, address) -> None:
        rpc_port, self.peer_pool = address
        self.target = f"{HOST}:{rpc_port}"

    def _write(self, n: int) -> None:
        """The pool's first n bytes into the receiver's pool."""
        self._ok(self.te.transfer_sync_write(self.target, self.pool.data_ptr(), self.peer_pool,
                                             n), "transfer_sync_write")

    def _stop(self) -> None:
        self.te.unregister_memory(self.pool.data_ptr())

    @staticmethod
    def _ok(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"Mooncake TransferEngine.{what} returned {rc}")

    # -- the protocol -----------------------------------------------------------------------
    def send(self, items) -> None:
        for name, tensor in items:
            data = _bytes(tensor.contiguous())
            if data.numel() > POOL:
                raise ValueError(f"{name}: {data.numel()} bytes, more than the pool's {POOL}")
            if data.numel():
                self.pool[:data.numel()].copy_(data)
                self._write(data.numel())
            self.conn.send((name, tuple(tensor.shape), tensor.dtype))
            self.conn.recv()  # copied out: the pools are free again
        self.conn.send(None)

    def receive(self):
        """The sync's items as they arrive, each into a tensor of its own."""
        while True:
            header = self.conn.recv()
            if header is None:
                return
            name, shape, dtype = header
            tensor = torch.empty(shape, dtype=dtype)
            data = _bytes(tensor)
            data.copy_(self.pool[:data.numel()])
            self.conn.send(True)
            yield name, tensor

    def close(self) -> None:
        self.conn.close()
        self._stop()
