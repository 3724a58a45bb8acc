"""What a weight sync pays for dpobs (issue 34), as ratios of arms run side by side.

The model: a small decoder's weights in bf16, about 67 MB over 34 tensors (4 layers of
hidden 1024: attention, MLP, norms; embedding and head of 6144 x 1024).

1. The proof's cost: fingerprinting every tensor as it leaves (weights/fingerprint.py)
   against one copy_ of the same tensors into preallocated buffers, at torch's thread count,
   interleaved round by round. A fingerprint reads each byte once; a copy reads and writes
   it. Required <= 1.0x, goal 0.5x.
2. The measurement without the proof: a real sync, the trainer broadcasting every tensor
   over gloo on loopback to one receiver process, raw against the same through
   tel.weights.sent / received with the guard off, and (third arm) with the guard on,
   interleaved. Printed two ways: the difference of the arms' medians over the raw sync
   (noisy: two processes on shared cores), and the wrappers' own time (both sides'
   wrappers iterated with no transport) over the raw sync. Required <= 1% without the
   proof; the proof's share is printed beside it.

    .venv/bin/python benchmarks/weights.py [--rounds 30] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import tempfile
import time

import torch

from dpobs_otel.weights import MANIFEST_NAME

HIDDEN, LAYERS, VOCAB = 1024, 4, 6144


def make_model() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {"embed.weight": (VOCAB, HIDDEN), "lm_head.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        shapes.update({p + "attn.qkv.weight": (3 * HIDDEN, HIDDEN),
                       p + "attn.o.weight": (HIDDEN, HIDDEN),
                       p + "mlp.up.weight": (HIDDEN // 2, HIDDEN),
                       p + "mlp.down.weight": (HIDDEN, HIDDEN // 2),
                       p + "attn.qkv.bias": (3 * HIDDEN,), p + "norm1.weight": (HIDDEN,),
                       p + "norm2.weight": (HIDDEN,), p + "mlp.up.bias": (HIDDEN // 2,)})
    return {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in shapes.items()}


def nbytes(model) -> int:
    return sum(t.numel() * t.element_size() for t in model.values())


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def proof_cost(model, rounds: int) -> dict:
    from dpobs_otel.weights.fingerprint import fingerprint
    bufs = {n: torch.empty_like(t) for n, t in model.items()}

    def fp():
        for n, t in model.items():
            fingerprint(n, t)

    def copy():
        for n, t in model.items():
            bufs[n].copy_(t)
    fp(), copy()  # warm: the kernel's library, the pool, first-touch of the buffers
    a, b = [], []
    for _ in range(rounds):
        a.append(_timed(fp))
        b.append(_timed(copy))
    ratios = [x / y for x, y in zip(a, b)]
    return {"fingerprint_ms": statistics.median(a) * 1e3, "copy_ms": statistics.median(b) * 1e3,
            "ratio_median": statistics.median(ratios), "ratio_of_medians":
            statistics.median(a) / statistics.median(b)}


# -- the sync over gloo ---------------------------------------------------------------------
ARMS = ("raw", "measured", "proven")  # round r runs ARMS[r % 3]; proven: the guard on


def _telemetries(role: str, rank: int):
    import dpobs_otel as dpobs
    return {arm: dpobs.start(role=role, rank=rank, port=0, host="127.0.0.1",
                             verify_tensor_hash=arm == "proven") for arm in ARMS[1:]}


def _wrapped(tels: dict, arm: str, stream, version: int, side: str):
    if arm == "raw":
        return stream
    w = tels[arm].weights
    return w.sent(stream, version=version) if side == "send" else w.received(stream, version)


def _receiver(init: str, rounds: int) -> None:
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=init, rank=1, world_size=2)
    tels = _telemetries("rollout", 1)
    model = make_model()
    bufs = [(n, torch.empty_like(t)) for n, t in model.items()]  # receive buffers, reused
    for r in range(len(ARMS) * (rounds + 1)):
        def arrivals():
            for n, t in bufs:
                dist.broadcast(t, src=0)
                yield n, t
            size = torch.zeros(1, dtype=torch.int64)  # the fingerprints' bytes, 0: none sent
            dist.broadcast(size, src=0)
            if size.item():
                manifest = torch.empty(int(size.item()), dtype=torch.uint8)
                dist.broadcast(manifest, src=0)
                yield MANIFEST_NAME, manifest
        for _ in _wrapped(tels, ARMS[r % len(ARMS)], arrivals(), r, "receive"):
            pass
    dist.barrier()
    for tel in tels.values():
        tel.shutdown()
    dist.destroy_process_group()


def sync_cost(model, rounds: int) -> dict:
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    init = f"file://{tempfile.mkdtemp()}/pg"
    ctx = mp.get_context("spawn")
    child = ctx.Process(target=_receiver, args=(init, rounds))
    child.start()
    dist.init_process_group("gloo", init_method=init, rank=0, world_size=2)
    tels = _telemetries("trainer", 0)
    times = {arm: [] for arm in ARMS}
    for r in range(len(ARMS) * (rounds + 1)):
        arm = ARMS[r % len(ARMS)]

        def push():
            sent_manifest = False
            for name, t in _wrapped(tels, arm, iter(model.items()), r, "send"):
                if name == MANIFEST_NAME:  # the receiver learns its size first
                    dist.broadcast(torch.tensor([t.numel()]), src=0)
                    sent_manifest = True
                dist.broadcast(t, src=0)
            if not sent_manifest:
                dist.broadcast(torch.zeros(1, dtype=torch.int64), src=0)
        dt = _timed(push)
        if r >= len(ARMS):  # the first round of each arm warms the connection
            times[arm].append(dt)
    dist.barrier()
    child.join()
    own = statistics.median(_timed(lambda: _wrappers_alone(tels["measured"], model, v))
                            for v in range(50))
    for tel in tels.values():
        tel.shutdown()
    dist.destroy_process_group()
    med = {arm: statistics.median(ts) for arm, ts in times.items()}
    base = med["raw"]
    return {"raw_ms": base * 1e3, "measured_ms": med["measured"] * 1e3,
            "proven_ms": med["proven"] * 1e3,
            "difference_over_sync": (med["measured"] - base) / base,
            "proof_over_sync": (med["proven"] - base) / base,
            "wrappers_ms": own * 1e3, "wrappers_over_sync": own / base}


def _wrappers_alone(tel, model, v: int) -> None:
    for _ in tel.weights.received(tel.weights.sent(iter(model.items()), version=v), version=v):
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    model = make_model()
    print(f"model: {len(model)} bf16 tensors, {nbytes(model) / 1e6:.1f} MB; "
          f"torch threads {torch.get_num_threads()}")
    proof = proof_cost(model, args.rounds)
    print("1. fingerprint every tensor vs one copy_ of them: {fingerprint_ms:.1f} ms vs "
          "{copy_ms:.1f} ms; ratio median {ratio_median:.2f}x, of medians "
          "{ratio_of_medians:.2f}x (required <= 1.0, goal 0.5)".format(**proof))
    sync = sync_cost(model, args.rounds)
    print("2. sync over gloo, raw {raw_ms:.1f} ms, through the wrappers (guard off) "
          "{measured_ms:.1f} ms: difference {difference_over_sync:+.2%} of the sync; the "
          "wrappers' own time {wrappers_ms:.3f} ms = {wrappers_over_sync:.2%} of the sync "
          "(required <= 1%); with the proof (guard on, both sides) {proven_ms:.1f} ms: "
          "{proof_over_sync:+.2%}".format(**sync))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"proof": proof, "sync": sync}, f, indent=1)


if __name__ == "__main__":
    main()
