"""The two-process run of tests/helpers/weights_transfers.py and the checks the live
Mooncake TransferEngine and NIXL tests share: the engine under test is the only difference."""
from __future__ import annotations

import multiprocessing as mp
from types import SimpleNamespace

from helpers import scrape, value
from helpers import weights_transfers as wt

from dpobs_otel import names


def pushed(make_engine) -> dict:
    """{rank: (samples, results, mismatched)} of a trainer (0) and a rollout (1)."""
    ctx = mp.get_context("spawn")
    boxes, out, release = (ctx.Queue(), ctx.Queue()), ctx.Queue(), ctx.Event()
    return collected([ctx.Process(target=wt.run, args=(make_engine, r, boxes[r], boxes[1 - r],
                                                       out, release)) for r in (0, 1)],
                     out, release)


def seen(make_engine, sender_dpobs: bool) -> list:
    """[(version, {name: bytes}, bytes beside)] of a rollout without dpobs."""
    ctx = mp.get_context("spawn")
    boxes, out = (ctx.Queue(), ctx.Queue()), ctx.Queue()
    procs = [ctx.Process(target=wt.seen, args=(make_engine, r, boxes[r], boxes[1 - r], out,
                                               sender_dpobs)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        got = [out.get(timeout=240) for _ in range(len(wt.MODES) + 2)]
    finally:  # as collected(): what came back is the result (NIXL may crash at exit)
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    assert sorted(g[1] for g in got if g[0] is None) == [0, 1]  # both sides ran to the end
    return sorted((g for g in got if g[0] is not None), key=lambda g: g[0])


def check_unchanged(make_engine) -> None:
    """A rollout without dpobs holds exactly what it holds with no dpobs anywhere, beside a
    trainer whose guard is on: every version's names and bytes, and nothing more announced."""
    guarded, plain = seen(make_engine, True), seen(make_engine, False)
    assert [v for v, _, _ in guarded] == list(wt.MODES)
    for (v, got, size), (_, want, plain_size) in zip(guarded, plain):
        assert list(got) == list(want) == list(wt.layout(v)), v
        assert got == want and size == plain_size == 0, v


def collected(procs, out, release) -> dict:
    """Start procs; each puts (rank, its endpoint's URL, *what it measured) on `out`, then
    waits for `release`: {rank: (its scraped samples, *what it measured)}."""
    for p in procs:
        p.start()
    try:
        results = {}
        for _ in procs:
            rank, url, *rest = out.get(timeout=240)
            endpoint = url.split("//", 1)[1].split("/", 1)[0]
            results[rank] = (scrape(SimpleNamespace(endpoint=endpoint)), *rest)
    finally:
        release.set()
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    return results


def check_counts(results) -> None:
    """Every sync counted exactly its process's truth; the exported totals are their sums."""
    for rank, side in ((0, "send"), (1, "receive")):
        samples, per_version, _ = results[rank]
        assert set(per_version) == set(wt.MODES)
        for v, got in per_version.items():
            assert got["counted"] == (got["bytes"], got["tensors"]), (side, v, wt.MODES[v])
        assert value(samples, names.WEIGHTS_TRANSFERRED_SERIES, side=side) == \
            sum(g["bytes"] for g in per_version.values())
        assert value(samples, names.WEIGHTS_TENSORS_SERIES, side=side) == \
            sum(g["tensors"] for g in per_version.values())


def check_proof(results) -> None:
    """The rollout holds the trainer's model bit for bit each version; the proof version's
    every tensor is checked, none mismatched."""
    samples, per_version, mismatched = results[1]
    assert all(g["same"] for g in per_version.values())
    proved = len(wt.layout(3))
    assert value(samples, names.WEIGHTS_CHECKED_SERIES) == proved
    assert all(n == 0 for n in mismatched.values()), mismatched
    for reason in names.WEIGHT_MISMATCH_REASONS:
        assert value(samples, names.WEIGHTS_MISMATCHED_SERIES, reason=reason) == 0
