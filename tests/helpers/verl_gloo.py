"""One process of a verl weight push (tests/adapters/verl/test_verl_gloo.py): `main()` in a
fresh interpreter whose environment turns dpobs on (DPOBS_AUTO=1 or the OpenTelemetry
launcher), or off. Rank 0 is the trainer, every other rank a rollout worker; the backend is
helpers.verl_backend, found the way verl finds a user's backend, and the weights are larger
than its bucket, so verl's chunking cuts and merges them.

Each version is one sync, timed by verl's own trainer timer (marked_timer("update_weights"),
what `timing_s/update_weights` reports); a last sync passes no step (verl's
`update_weights()` after a colocated reward pass). Prints one JSON line: this process's own
/metrics text (when dpobs serves one), what it moved by its own count, verl's timer
readings, and whether verl's classes carry dpobs's methods.

It never names dpobs: whatever measures it comes from its environment.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request

import torch

BUCKET = 2 << 20
VERSIONS = (1, 2, 3)
CORRUPT = {1: 2}  # receiver rank -> the version its wire corrupts (one bit of one bucket)
# bf16, 9.5 MiB a version: embed (4 MiB) and mlp (3 MiB) are larger than a bucket
SHAPES = {"embed.weight": (4096, 512), "layers.0.qkv.weight": (1536, 512),
          "layers.0.qkv.bias": (1536,), "layers.0.mlp.weight": (3072, 512),
          "layers.0.norm.weight": (512,), "lm_head.weight": (1024, 512)}


def model(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in SHAPES.items()}


def payload(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def patched() -> dict[str, bool]:
    """Whether each engine class's methods are still verl's own (no __wrapped__)."""
    from verl.checkpoint_engine.base import CheckpointEngine

    from .verl_backend import GlooCheckpointEngine
    out = {f"{c.__name__}.{m}": hasattr(c.__dict__.get(m), "__wrapped__")
           for c in (GlooCheckpointEngine, *CheckpointEngine.__subclasses__())
           for m in ("send_weights", "receive_weights") if m in c.__dict__}
    out["base.__init_subclass__"] = "__init_subclass__" in CheckpointEngine.__dict__
    return out


def _models() -> dict:
    """Every version's weights, made before the first sync: no process computes between two
    syncs (a receiver that did would hold the trainer's next broadcast inside its timer)."""
    return {v: model(v or VERSIONS[-1]) for v in (*VERSIONS, None)}


async def _send(engine) -> list[float]:
    from verl.utils.profiler.performance import marked_timer
    readings = []
    for version, weights in _models().items():
        timing: dict[str, float] = {}
        with marked_timer("update_weights", timing):
            await engine.send_weights(iter(weights.items()), global_steps=version)
        readings.append(timing["update_weights"])
    return readings


async def _receive(engine) -> tuple[list[float], dict]:
    from verl.utils.profiler.performance import marked_timer
    readings, kept, models = [], [], _models()
    for version in models:
        timing: dict[str, float] = {}
        got = {}
        with marked_timer("update_weights", timing):
            async for name, tensor in engine.receive_weights(global_steps=version):
                got[name] = tensor.clone()  # the buffer is reused: keep a copy
        readings.append(timing["update_weights"])
        kept.append(got)
    equal = [got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)
             for got, want in zip(kept, models.values())]
    return readings, {"bytes": sum(payload(g.values()) for g in kept),
                      "tensors": sum(len(g) for g in kept), "equal": equal,
                      "names": [list(g) for g in kept]}


def _engine(rank: int, world: int):
    from verl.checkpoint_engine import CheckpointEngineRegistry
    from verl.utils.import_utils import import_external_libs

    import_external_libs("helpers.verl_backend")  # checkpoint_engine.custom_backend_module
    from .verl_backend import BACKEND
    engine = CheckpointEngineRegistry.new(BACKEND, bucket_size=BUCKET,
                                          init_method=os.environ["V_INIT"],
                                          corrupt_at=CORRUPT.get(rank))
    actor, rollout = type(engine).build_topology(1, world - 1, [engine.prepare()])
    side, i = (actor, rank) if rank == 0 else (rollout, rank - 1)
    engine.init_process_group(**{k: v[i] for k, v in side.items()})
    return engine


def _fetch() -> str | None:
    port = os.environ.get("V_METRICS_PORT")
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except OSError:  # nothing serves there: dpobs is off
        return None


def _own_metrics(checked: int | None) -> str | None:
    """This process's /metrics text; a receiver's once its checks have counted `checked`
    tensors (out of band they count when the sender's manifest has been read from the
    store, just after the sync), or after 60 s."""
    deadline = time.monotonic() + 60
    text = _fetch()
    while text is not None and checked is not None and time.monotonic() < deadline:
        counted = [line for line in text.splitlines()
                   if line.startswith("dpobs_weights_tensors_checked_total")]
        if counted and float(counted[0].split()[-1]) >= checked:
            break
        time.sleep(0.05)
        text = _fetch()
    return text


def main() -> None:
    rank, world = int(os.environ["V_RANK"]), int(os.environ["V_WORLD"])
    engine = _engine(rank, world)
    try:
        if rank == 0:
            readings, truth = asyncio.run(_send(engine)), None
        else:
            readings, truth = asyncio.run(_receive(engine))
    finally:
        engine.finalize()
    checked = None if truth is None else truth["tensors"]
    print(json.dumps({"rank": rank, "verl_timer_s": readings, "truth": truth,
                      "patched": patched(), "metrics": _own_metrics(checked)}))
