"""The demo's weight transport (`--weight-sync gloo`): torch.distributed over the gloo backend
between the demo's real processes, the trainer as rank 0 (the sender), the rollout as rank 1.

One sync is a run of (name, tensor) items, each sent as a header (name, shape, dtype) and then
its payload, one item at a time: the stream's last item (the guard's fingerprints, which the
sending wrapper appends) is sized only when the wrapper yields it, so no header could announce
the whole sync up front. A None header ends the sync. Both go by broadcast over the group.

Loopback only: the rendezvous store listens on a socket bound here to 127.0.0.1 (a TCPStore
given a port binds every interface), gloo's own sockets on the loopback interface."""
from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist

SENDER = 0
TIMEOUT_S = 300  # as the workload's barrier: an orphan gives up, a live parent aborts sooner


def _loopback() -> str:
    """The loopback interface's name (lo on Linux, lo0 on macOS), for gloo's sockets."""
    for _index, name in socket.if_nameindex():
        if name.startswith("lo"):
            return name
    raise RuntimeError("no loopback interface for gloo")


def _store(rank: int, world: int, port) -> dist.TCPStore:
    """The group's rendezvous: the sender listens on 127.0.0.1 (a free port, published in the
    shared Value `port`), the others connect once it has."""
    timeout = timedelta(seconds=TIMEOUT_S)
    if rank == SENDER:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(world)
        number = sock.getsockname()[1]
        store = dist.TCPStore("127.0.0.1", number, world, is_master=True, timeout=timeout,
                              wait_for_workers=False, master_listen_fd=sock.detach())
        port.value = number
        return store
    deadline = time.monotonic() + TIMEOUT_S
    while port.value == 0:
        if time.monotonic() > deadline:
            raise TimeoutError("the weight sender never published its rendezvous port")
        time.sleep(0.01)
    return dist.TCPStore("127.0.0.1", port.value, world, is_master=False, timeout=timeout)


class Gloo:
    """One process's end of the weight group: `send(items)` on the sender, `receive()` on the
    others, in the same order every sync."""

    def __init__(self, rank: int, world: int, port):
        os.environ["GLOO_SOCKET_IFNAME"] = _loopback()
        dist.init_process_group("gloo", store=_store(rank, world, port), rank=rank,
                                world_size=world, timeout=timedelta(seconds=TIMEOUT_S))

    @staticmethod
    def send(items) -> None:
        for name, tensor in items:
            dist.broadcast_object_list([(name, tuple(tensor.shape), tensor.dtype)], src=SENDER)
            dist.broadcast(tensor.contiguous(), src=SENDER)
        dist.broadcast_object_list([None], src=SENDER)

    @staticmethod
    def receive():
        """The sync's items as they arrive, each into a tensor of its own."""
        while True:
            header = [None]
            dist.broadcast_object_list(header, src=SENDER)
            if header[0] is None:
                return
            name, shape, dtype = header[0]
            tensor = torch.empty(shape, dtype=dtype)
            dist.broadcast(tensor, src=SENDER)
            yield name, tensor

    @staticmethod
    def close() -> None:
        dist.destroy_process_group()
