"""Bandwidth of one weight sync per transport (issue 35), with the demo's model and transports:
the 39 bf16 tensors of `dpobs demo --weight-sync` (62.9 MB), pushed from a sender process to
a receiver process on loopback, one tensor at a time as the demo does, through:

    gloo      dpobs_otel/demo/gloo.py: a header then the payload, both by broadcast
    mooncake  dpobs_otel/demo/mooncake_te.py: Mooncake's TransferEngine over TCP, each tensor
              staged in a registered pool, written one-sided, acknowledged
    nixl      the same protocol as mooncake, the write a NIXL (UCX over TCP on lo) request

Each round is one sync through tel.weights.sent / received (guard off), both processes
started at a barrier; the sender's clock runs from the barrier to its last item's
acknowledgement. Printed per transport: the median round, the bandwidth it gives, and dpobs's
own reading (its bytes over its seconds on each side, from the processes' stats).

    unshare --net sh -c 'ip link set lo up && exec "$0" "$@"' \\
        .venv/bin/python benchmarks/weight_transports.py [--rounds 10] \\
        [--transports gloo,mooncake,nixl]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

from dpobs_otel.demo.mooncake_te import HOST, POOL, MooncakeTE


class NixlStaged(MooncakeTE):
    """The demo's staged protocol, its write a NIXL request (the UCX backend, TCP on lo)."""

    def _start(self) -> None:
        os.environ.setdefault("UCX_TLS", "tcp,self")
        os.environ.setdefault("UCX_NET_DEVICES", "lo")
        try:
            import nixl._api as api
        except ImportError:
            import nixl_cu12._api as api
        self.agent = api.nixl_agent(f"bench-{os.getpid()}",
                                    api.nixl_agent_config(backends=["UCX"]))
        self.registered = self.agent.register_memory(self.pool)

    def _address(self):
        return self.agent.get_agent_metadata(), self.pool.data_ptr()

    def _connect(self, address) -> None:
        metadata, self.peer_pool = address
        self.remote = self.agent.add_remote_agent(metadata)

    def _write(self, n: int) -> None:
        a = self.agent
        handle = a.initialize_xfer("WRITE",
                                   a.get_xfer_descs([(self.pool.data_ptr(), n, 0)], "DRAM"),
                                   a.get_xfer_descs([(self.peer_pool, n, 0)], "DRAM"),
                                   self.remote)
        state = a.transfer(handle)
        while state == "PROC":
            state = a.check_xfer_state(handle)
        a.release_xfer_handle(handle)
        if state != "DONE":
            raise RuntimeError(f"NIXL write ended {state}")

    def _stop(self) -> None:
        self.agent.deregister_memory(self.registered)


def _transport(name: str):
    from dpobs_otel.demo.gloo import Gloo
    return {"gloo": Gloo, "mooncake": MooncakeTE, "nixl": NixlStaged}[name]


def side(name: str, rank: int, port, barrier, rounds: int, out) -> None:
    import dpobs_otel as dpobs
    from dpobs_otel.demo import weightsync as ws
    transport = _transport(name)(rank, 2, port)
    tel = dpobs.start(role="trainer" if rank == 0 else "rollout", rank=rank, port=0,
                      host="127.0.0.1")
    tensors = ws.Model(0).tensors
    times = []
    try:
        for v in range(rounds + 1):  # round 0 warms the connection up, unmeasured
            barrier.wait()
            t0 = time.perf_counter()
            if rank == 0:
                transport.send(tel.weights.sent(tensors.items(), version=v))
            else:
                dict(tel.weights.received(transport.receive(), version=v))
            if v:
                times.append(time.perf_counter() - t0)
        stats = tel.weights.stats()
        out.put((rank, times, stats, ws.nbytes(tensors.values())))
    finally:
        tel.shutdown()
        transport.close()


def bench(name: str, rounds: int) -> None:
    ctx = mp.get_context("spawn")
    port, barrier, out = ctx.Value("i", 0), ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=side, args=(name, r, port, barrier, rounds, out))
             for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict((r, rest) for r, *rest in (out.get(timeout=600) for _ in procs))
    for p in procs:
        p.join(60)
    times, _, nbytes = got[0]
    median = statistics.median(times)
    print(f"{name:9s} {nbytes / 1e6:.1f} MB per sync, {rounds} rounds: median "
          f"{median * 1e3:.1f} ms = {nbytes / median / 1e9:.2f} GB/s "
          f"(min {min(times) * 1e3:.1f} ms, max {max(times) * 1e3:.1f} ms)")
    for rank, label in ((0, "send"), (1, "receive")):
        st = got[rank][1]  # every sync, the warm-up's too
        print(f"          dpobs {label:7s}: {st['syncs']} syncs, {st['bytes']} bytes, "
              f"{st['tensors']} tensors, {st['bytes'] / st['seconds'] / 1e9:.2f} GB/s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--transports", default="gloo,mooncake,nixl")
    args = p.parse_args()
    print(f"staging pool {POOL >> 20} MB, host {HOST}")
    for name in args.transports.split(","):
        bench(name, args.rounds)


if __name__ == "__main__":
    main()
