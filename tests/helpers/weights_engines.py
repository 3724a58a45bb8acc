"""The two transfer engines tests/helpers/weights_transfers.py drives, each on loopback only:
one registered CPU pool per process, `write(pairs)` / `read(pairs)` over (local address,
remote address, length) triples, one engine call for the whole list (`write` of one pair is
one per-tensor call).

Mooncake: TransferEngine in P2P-handshake mode (no metadata server: peers are named by
127.0.0.1:<rpc port>, the RPC listener bound to 127.0.0.1) over its TCP transport
(MC_TCP_BIND_ADDRESS=127.0.0.1). NIXL: an agent with the UCX backend, UCX over TCP on lo;
writes are initialize_xfer requests, reads prepared lists (prep_xfer_dlist,
make_prepped_xfer)."""
from __future__ import annotations

import os
import time

import torch

HOST = "127.0.0.1"


class MooncakeTE:
    def __init__(self, size: int):
        os.environ.setdefault("MC_TCP_BIND_ADDRESS", HOST)
        from mooncake.engine import TransferEngine
        self.te = TransferEngine()
        self._ok(self.te.initialize(HOST, "P2PHANDSHAKE", "tcp", ""), "initialize")
        self.pool = torch.zeros(size, dtype=torch.uint8)
        self._ok(self.te.register_memory(self.pool.data_ptr(), size), "register_memory")
        self.peer = self.target = None

    @staticmethod
    def _ok(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"TransferEngine.{what} returned {rc}")

    def info(self):
        return self.te.get_rpc_port(), self.pool.data_ptr()

    def connect(self, info) -> None:
        port, self.peer = info
        self.target = f"{HOST}:{port}"

    def write(self, pairs) -> None:
        if len(pairs) == 1:
            (local, remote, n), = pairs
            self._ok(self.te.transfer_sync_write(self.target, local, remote, n), "write")
            return
        self._ok(self.te.batch_transfer_sync_write(self.target, *map(list, zip(*pairs))),
                 "batch write")

    def read(self, pairs) -> None:
        self._ok(self.te.batch_transfer_sync_read(self.target, *map(list, zip(*pairs))),
                 "batch read")

    def close(self) -> None:
        self.te.unregister_memory(self.pool.data_ptr())


def nixl_module():
    """nixl_agent's module: the `nixl` package's, else the nixl-cu12 wheel's."""
    try:
        import nixl._api as api
    except ImportError:
        import nixl_cu12._api as api
    return api


class Nixl:
    def __init__(self, size: int):
        os.environ.setdefault("UCX_TLS", "tcp,self")
        os.environ.setdefault("UCX_NET_DEVICES", "lo")
        api = nixl_module()
        self.agent = api.nixl_agent(f"dpobs-{os.getpid()}",
                                    api.nixl_agent_config(backends=["UCX"]))
        self.pool = torch.zeros(size, dtype=torch.uint8)
        self.registered = self.agent.register_memory(self.pool)
        self.peer = self.remote = None
        self._prepared = {}

    def info(self):
        return self.agent.get_agent_metadata(), self.pool.data_ptr()

    def connect(self, info) -> None:
        metadata, self.peer = info
        self.remote = self.agent.add_remote_agent(metadata)

    def _descs(self, pairs, column: int):
        return [(p[column], p[2], 0) for p in pairs]

    def _run(self, handle) -> None:
        state = self.agent.transfer(handle)
        while state == "PROC":
            state = self.agent.check_xfer_state(handle)
            time.sleep(0)
        if state != "DONE":
            raise RuntimeError(f"NIXL transfer ended {state}")

    def write(self, pairs) -> None:
        a = self.agent
        handle = a.initialize_xfer("WRITE", a.get_xfer_descs(self._descs(pairs, 0), "DRAM"),
                                   a.get_xfer_descs(self._descs(pairs, 1), "DRAM"),
                                   self.remote)
        try:
            self._run(handle)
        finally:
            a.release_xfer_handle(handle)

    def read(self, pairs) -> None:
        """One prepared request per list of pairs, made once, posted every call."""
        key = tuple(pairs)
        if key not in self._prepared:
            a = self.agent
            local = a.prep_xfer_dlist("NIXL_INIT_AGENT", self._descs(pairs, 0), "DRAM")
            remote = a.prep_xfer_dlist(self.remote, self._descs(pairs, 1), "DRAM")
            every = list(range(len(pairs)))
            self._prepared[key] = a.make_prepped_xfer("READ", local, every, remote, every)
        self._run(self._prepared[key])

    def close(self) -> None:
        for handle in self._prepared.values():
            self.agent.release_xfer_handle(handle)
        self.agent.deregister_memory(self.registered)
