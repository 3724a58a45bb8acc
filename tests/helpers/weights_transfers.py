"""A weight push between two real processes through a transfer engine driven directly (Mooncake's
TransferEngine over TCP, NIXL over UCX, both on loopback), for tests/weights: each process
holds one registered pool, the weights of a version as views at fixed offsets, and a control
queue says when a version is in place. Per version the engine's calls run inside one side's
`tel.weights.sync` block, the other side only note()s:

    write  the trainer writes every tensor, one call each (no note: the hook alone counts)
    read   the rollout reads every tensor in one batched call (no note: the hook alone counts)
    proof  both note every tensor (the fingerprints); the trainer writes them in one batch,
           then its manifest after its block; the rollout notes the manifest and checks

The two processes share no store (no process group, no Ray): the proof travels in band
(weights_in_band), as a transfer of its own, the setting's very case.

`seen()`: the proof mode only, the trainer's guard on with the default carriage (nothing
transferred but the weights) or no dpobs at all, the rollout with no dpobs: what its program
holds after each version, name by name, bytes for bytes, and how many bytes came beside.

Each process reports per version what its sync counted beside its own truth (numel x element
size of its views, their count), and the rollout whether every tensor it holds equals the
trainer's model bit for bit (weights.model, rebuilt here)."""
from __future__ import annotations

import torch

from dpobs_otel.weights import MANIFEST_NAME

from . import weights

MODES = {1: "write", 2: "read", 3: "proof"}
ALIGN = 64
MANIFEST_AT, POOL = 1 << 16, 1 << 17  # the manifest's room, then the pool's end


def layout(version: int) -> dict[str, tuple[int, torch.Tensor]]:
    """name -> (offset in the pool, the tensor) of a version's model."""
    out, at = {}, 0
    for name, t in weights.model(version).items():
        out[name] = (at, t)
        at += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    assert at <= MANIFEST_AT
    return out


def views(pool: torch.Tensor, version: int) -> dict[str, torch.Tensor]:
    """The pool's bytes read as each tensor of the version's layout."""
    out = {}
    for name, (at, t) in layout(version).items():
        n = t.numel() * t.element_size()
        out[name] = pool[at:at + n].view(t.dtype).view(t.shape)
    return out


def pairs(mine: torch.Tensor, theirs: int, version: int) -> list[tuple[int, int, int]]:
    """(local address, remote address, length) of every tensor of the version."""
    base = mine.data_ptr()
    return [(base + at, theirs + at, t.numel() * t.element_size())
            for at, t in layout(version).values()]


def _truth(tensors) -> dict:
    return {"bytes": weights.payload_bytes(tensors), "tensors": len(tensors)}


def _send(tel, engine, pool, peer, v, mode, to_peer, from_peer) -> dict:
    for name, t in views(pool, v).items():
        t.copy_(layout(v)[name][1])
    todo, held = pairs(pool, peer, v), views(pool, v)  # held: a note pairs with a live tensor
    with tel.weights.sync(version=v, side="send") as s:
        if mode != "write":
            for name, t in held.items():
                s.note(name, t)
        if mode == "write":
            for p in todo:
                engine.write([p])
        elif mode == "proof":
            engine.write(todo)
        if mode == "read":  # the rollout reads while this block is open
            to_peer.put((v, 0))
            from_peer.get(timeout=120)
    if mode != "read":
        item = s.manifest() if mode == "proof" else None
        size = 0 if item is None else _manifest(engine, pool, peer, item)
        to_peer.put((v, size))
        from_peer.get(timeout=120)
    counted = (s.bytes, s.tensors) if tel.enabled else None  # dpobs off: nothing counted
    return {"counted": counted, **_truth(list(held.values()))}


def _manifest(engine, pool, peer, item) -> int:
    """The fingerprints, written to the rollout's manifest room as one more transfer."""
    data = item[1]
    pool[MANIFEST_AT:MANIFEST_AT + data.numel()].copy_(data)
    engine.write([(pool.data_ptr() + MANIFEST_AT, peer + MANIFEST_AT, data.numel())])
    return data.numel()


def _receive(tel, engine, pool, peer, v, mode, to_peer, from_peer) -> dict:
    _, size = from_peer.get(timeout=120)
    got = views(pool, v)
    with tel.weights.sync(version=v, side="receive") as s:
        if mode == "read":
            engine.read(pairs(pool, peer, v))
        else:
            for name, t in got.items():
                s.note(name, t)
        if size:
            s.note(MANIFEST_NAME, pool[MANIFEST_AT:MANIFEST_AT + size])
    want = weights.model(v)
    same = all(torch.equal(got[n].view(torch.uint8), want[n].view(torch.uint8)) for n in want)
    to_peer.put(v)  # compared first: the trainer writes the next version into this pool
    return {"counted": (s.bytes, s.tensors), "same": same, **_truth(list(got.values()))}


def run(make_engine, rank: int, inbox, outbox, out, release) -> None:
    """Rank 0 the trainer, rank 1 the rollout; `make_engine(size)` returns this process's
    engine with its pool registered, made before dpobs starts as a user's would be."""
    import dpobs_otel as dpobs
    engine = make_engine(POOL)
    tel = dpobs.start(role="trainer" if rank == 0 else "rollout", rank=rank, port=0,
                      host="127.0.0.1", verify_tensor_hash=True, weights_in_band=True)
    outbox.put(engine.info())
    engine.connect(inbox.get(timeout=120))
    side = _send if rank == 0 else _receive
    try:
        results = {v: side(tel, engine, engine.pool, engine.peer, v, mode, outbox, inbox)
                   for v, mode in MODES.items()}
        out.put((rank, tel.url, results, dict(tel.weights.meter.stats.mismatched)))
        release.wait(120)  # the parent scrapes both before either stops
    finally:
        tel.shutdown()
        engine.close()


def seen(make_engine, rank: int, inbox, outbox, out, sender_dpobs: bool) -> None:
    """Rank 0 writes every version as the proof mode does (guarded when sender_dpobs, else
    with dpobs off); rank 1, which never starts dpobs, puts (version, {name: bytes}, bytes
    announced beside them) on `out` for each."""
    from dpobs_otel.facade import DisabledTelemetry
    engine = make_engine(POOL)
    tel = DisabledTelemetry()
    if rank == 0 and sender_dpobs:
        import dpobs_otel as dpobs
        tel = dpobs.start(role="trainer", rank=0, port=0, host="127.0.0.1",
                          verify_tensor_hash=True)
    outbox.put(engine.info())
    engine.connect(inbox.get(timeout=120))
    try:
        for v in MODES:
            if rank == 0:
                _send(tel, engine, engine.pool, engine.peer, v, "proof", outbox, inbox)
                continue
            _, size = inbox.get(timeout=120)
            held = {n: t.view(torch.uint8).numpy().tobytes()
                    for n, t in views(engine.pool, v).items()}
            outbox.put(v)
            out.put((v, held, size))
        out.put((None, rank, True))
    finally:
        tel.shutdown()
        engine.close()
