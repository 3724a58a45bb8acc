"""A weight push over torch.distributed gloo between real processes, for tests/weights: rank 0
sends a model each version through tel.weights.sent, every other rank receives it through
tel.weights.received; a receiver may tamper with what it got (before its wrapper sees it),
one kind per version. The transport is the demo's (demo/gloo.py: loopback only, a header
then the payload per item)."""
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
            checks[v] = {r: n - before[r] for r, n in _mismatches(tel).items() if n > before[r]}
        out.put((rank, tel.url, truth, checks))
        release.wait(120)  # the parent scrapes every process before any of them stops
    finally:
        tel.shutdown()
        dist.destroy_process_group()
