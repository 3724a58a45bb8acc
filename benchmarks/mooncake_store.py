"""dpobs's own cost per op on a live Mooncake store, bare vs measured, side by side.

    .venv/bin/python benchmarks/mooncake_store.py [--rows 256] [--iters 40]
    # as root, loopback only:
    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/mooncake_store.py'

Starts a private mooncake_master on free loopback ports (lease 200 ms) and one client, and
stops them at the end. Two pairs of arms, interleaved call by call with the order rotating
each iteration, so drift on a shared machine hits both arms alike:
  * protocol: MooncakeDataPlane bare vs tel.instrument(MooncakeDataPlane): put, get (every
    field) and clear of the demo's 256-row GRPO batch (`dpobs demo`'s workload: jagged int64
    tokens, float32 logprobs and bool mask of 64-512 per row, float32 advantages, a dict of
    metadata per row), each arm in its own namespace;
  * raw: the store's batch_put_tensor / batch_get_tensor of the same 256 token rows and
    batch_remove of the 256 put `--lag` iterations earlier (their lease over), bare vs
    instrument_store.
Prints medians (ms) per op and arm, the median difference, and dpobs's own time per op
(dpobs_instrumentation_time_seconds_total's increase over the calls: measured directly, not
a difference of two noisy medians) as a share of the bare median; the goal is under 2%.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from progress import Progress  # benchmarks/progress.py: the script's folder is on sys.path

import dpobs_otel as dpobs
from dpobs_otel.adapters.mooncake import MooncakeDataPlane, instrument_store
from dpobs_otel.demo.batches import Config, make_rows, pack
from dpobs_otel.sizing import payload_nbytes
from dpobs_otel.testing.mooncake import MooncakeMaster

OPS = ("put", "get", "clear")


def timed(fn, tel):
    """(result, seconds, dpobs's own seconds in the call); own time is read outside the
    timed span."""
    own0 = own_seconds(tel) if tel is not None else 0.0
    t0 = time.perf_counter()
    result = fn()
    dt = time.perf_counter() - t0
    own = own_seconds(tel) - own0 if tel is not None else 0.0
    return result, dt, own


def own_seconds(tel) -> float:
    with tel.stats.lock:
        return sum(tel.stats.instr_seconds.values())


def protocol_round(client, tel, it, rows, td):
    ids = [f"i{it}-{r}" for r in range(rows)]
    _, put, own_put = timed(lambda: client.put_samples(ids, "bench", td), tel)
    got, get, own_get = timed(lambda: client.get_samples(ids, "bench"), tel)
    _, clear, own_clear = timed(lambda: client.clear_samples(ids, "bench"), tel)
    assert got.batch_size[0] == rows
    return {"put": (put, own_put), "get": (get, own_get), "clear": (clear, own_clear)}


def raw_round(store, tel, prefix, it, tensors, lag):
    """Put and read this iteration's keys; remove those of `lag` iterations ago, whose read
    lease has ended (a remove right after the read would only meet the lease: -706)."""
    keys = [f"{prefix}/{it}/{r}" for r in range(len(tensors))]
    old = [f"{prefix}/{it - lag}/{r}" for r in range(len(tensors))]
    _, put, own_put = timed(lambda: store.batch_put_tensor(keys, tensors), tel)
    got, get, own_get = timed(lambda: store.batch_get_tensor(keys), tel)
    codes, clear, own_clear = timed(lambda: store.batch_remove(old), tel)
    assert all(g is not None for g in got)
    if it >= lag:
        assert set(codes) == {0}, set(codes)
    return {"put": (put, own_put), "get": (get, own_get), "clear": (clear, own_clear)}


def report(title, times) -> None:
    print(f"\n{title}")
    print(f"{'op':<6} {'bare ms':>9} {'dpobs ms':>9} {'diff ms':>9} {'own us':>8} "
          f"{'own/bare':>9}")
    for op in OPS:
        bare = statistics.median(t for t, _ in times[("bare", op)])
        meas = statistics.median(t for t, _ in times[("dpobs", op)])
        own = statistics.median(o for _, o in times[("dpobs", op)])
        print(f"{op:<6} {bare * 1e3:>9.2f} {meas * 1e3:>9.2f} {(meas - bare) * 1e3:>+9.2f} "
              f"{own * 1e6:>8.1f} {own / bare:>9.3%}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--lag", type=int, default=5, help="raw arm: remove the keys of this "
                    "many iterations ago (past the 200 ms lease)")
    a = ap.parse_args()
    rows = make_rows(0, Config(batch_size=a.rows), torch.Generator().manual_seed(0))
    td = pack(rows)  # the demo's GRPO batch
    tensors = rows["tokens"]
    with MooncakeMaster(lease_ms=200) as master:
        store = master.connect(global_segment=512 << 20, local_buffer=256 << 20)
        tels = [dpobs.start(role="bench", rank=r, port=0) for r in (0, 1)]
        planes = [MooncakeDataPlane(store, namespace=ns, lease_s=master.lease_s)
                  for ns in ("bare", "dpobs")]
        arms = {"protocol": {"bare": (planes[0], None),
                             "dpobs": (tels[0].instrument(planes[1]), tels[0])},
                "raw": {"bare": (store, None),
                        "dpobs": (instrument_store(tels[1], store), tels[1])}}
        times = {kind: {(arm, op): [] for arm in ("bare", "dpobs") for op in OPS}
                 for kind in arms}
        try:
            progress = Progress(a.warmup + a.iters, "iterations")
            for it in range(a.warmup + a.iters):
                progress(it)  # before the iteration's timed rounds
                order = ["bare", "dpobs"] if it % 2 == 0 else ["dpobs", "bare"]
                for kind in arms:
                    for arm in order:
                        client, tel = arms[kind][arm]
                        res = (protocol_round(client, tel, it, a.rows, td) if kind == "protocol"
                               else raw_round(client, tel, f"raw-{arm}", it, tensors, a.lag))
                        if it >= a.warmup:
                            for op in OPS:
                                times[kind][(arm, op)].append(res[op])
            progress(a.warmup + a.iters)
            progress.finish()
            print(f"Mooncake 0.3.13 (TCP, loopback), {a.rows} rows, "
                  f"{payload_nbytes(td) / 1024:.0f} KiB payload; {a.iters} interleaved iterations after {a.warmup} warm-up; "
                  "medians")
            report("protocol: MooncakeDataPlane vs tel.instrument(MooncakeDataPlane)",
                   times["protocol"])
            report("raw: store.batch_put_tensor / batch_get_tensor / batch_remove (256 token "
                   "rows) vs instrument_store", times["raw"])
            print("\nown = dpobs_instrumentation_time_seconds_total's increase in the call "
                  "(dpobs's own time, measured directly); goal: own/bare under 2%")
        finally:
            for p in planes:
                p.flush_clears(5)
                p.close()
            for t in tels:
                t.shutdown()
            store.close()


if __name__ == "__main__":
    main()
