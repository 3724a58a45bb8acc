"""A weight push over torch.distributed gloo between real processes, for tests/weights: rank 0
sends a model each version through tel.weights.sent, every other rank receives it through
tel.weights.received; a receiver may tamper with what it got (before its wrapper sees it),
one kind per version. The transport is the demo's (demo/gloo.py: loopback only, a header
then the payload per item). The proof travels out of band, through the group's own store.

`seen()`: the same push where only the sender may run dpobs (its guard on) and the receivers
import nothing of it; each receiver reports what its program saw, item by item."""
from __future__ import annotations

import torch
import torch.distributed as dist

from dpobs_otel.demo.gloo import Gloo

from . import weights

# version -> how receiver rank 1 tampers with it (rank 2 never does)
TAMPER = {2: "flip", 3: "swap", 4: "dtype", 5: "missing", 6: "extra"}
VERSIONS = range(1, 8)


def model(version: int) -> dict[str, torch.Tensor]:
    return weights.model(version)


def _tampered(items, how):
    for i, (name, t) in enumerate(items):
        if how == "flip" and i == 1:
            t.view(-1)[5] = -t.view(-1)[5] + 1
        elif how == "swap" and i == 0:
            t[[0, 1]] = t[[1, 0]]
        elif how == "dtype" and i == 2:
            t = t.float()
        elif how == "missing" and i == 3:
            continue
        elif how == "extra" and i == 0:
            yield "rogue.bias", torch.zeros(7)
        yield name, t


def _mismatches(tel) -> dict[str, int]:
    return dict(tel.weights.meter.stats.mismatched)


def _item(name: str, t: torch.Tensor) -> tuple:
    """What a program sees of one item: its name, dtype, shape and exact bytes."""
    raw = t.contiguous().view(-1).view(torch.uint8).numpy()
    return name, str(t.dtype), tuple(t.shape), raw.tobytes()


def seen(rank: int, world: int, port, out, sender_dpobs: bool) -> None:
    """Rank 0 pushes every version (through tel.weights.sent, guard on, when sender_dpobs;
    otherwise with no dpobs anywhere); each other rank, which never imports dpobs, reports
    [(version, [item...])] of what its program received."""
    gloo = Gloo(rank, world, port)
    tel = None
    try:
        if rank == 0 and sender_dpobs:
            import dpobs_otel as dpobs
            tel = dpobs.start(role="trainer", rank=0, port=0, host="127.0.0.1",
                              verify_tensor_hash=True)
        for v in VERSIONS:
            if rank == 0:
                items = iter(model(v).items())
                gloo.send(items if tel is None else tel.weights.sent(items, version=v))
            else:
                out.put((rank, v, [_item(n, t) for n, t in gloo.receive()]))
        if rank == 0:
            out.put((0, None, tel is not None and tel.weights.settle(60)))
        dist.barrier()  # the sender's store outlives every receiver's last read
    finally:
        if tel is not None:
            tel.shutdown()
        dist.destroy_process_group()


def run(rank: int, world: int, port, out, release) -> None:
    import dpobs_otel as dpobs
    gloo = Gloo(rank, world, port)
    tel = dpobs.start(role="trainer" if rank == 0 else "rollout", rank=rank, port=0,
                      host="127.0.0.1", verify_tensor_hash=True)
    checks, truth = {}, {"bytes": 0, "tensors": 0}
    try:
        for v in VERSIONS:
            if rank == 0:
                gloo.send(tel.weights.sent(iter(model(v).items()), version=v))
                continue
            how = TAMPER.get(v) if rank == 1 else None
            before = _mismatches(tel)
            got = dict(tel.weights.received(_tampered(gloo.receive(), how), version=v))
            truth["bytes"] += sum(t.numel() * t.element_size() for t in got.values())
            truth["tensors"] += len(got)
            assert tel.weights.settle(60)  # this version's check, read from the group's store
            checks[v] = {r: n - before[r] for r, n in _mismatches(tel).items() if n > before[r]}
        out.put((rank, tel.url, truth, checks))
        release.wait(120)  # the parent scrapes every process before any of them stops
    finally:
        tel.shutdown()
        dist.destroy_process_group()
