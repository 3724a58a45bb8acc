"""put / get latency on a live TransferQueue, bare vs through dpobs (guard off / on).

    .venv/bin/python benchmarks/transferqueue.py [--rows 256] [--iters 30] [--runs 5]
                                                 [--alternatives] [--row-age]

Starts a private local Ray + TransferQueue (one storage unit, num_cpus=2; dpobs_otel/testing/transferqueue.py)
and stops it at the end. A 256-row batch shaped like a GRPO rollout (jagged int64 tokens of
200-311, a bf16 (N, 3), a bool (N, 64) mask, a float32 (N,) score) is put and read back
(select_fields = the tensor fields) by three clients, interleaved call by call so drift on a
shared machine hits all three alike (who goes first rotates): the bare transfer_queue module,
the instrumented one, and the instrumented one with verify_tensor_hash. Each client writes its
own partition.
Prints, per run, medians in ms and each client's median as a ratio of the bare one; with
--runs R, the median of the R runs' ratios and their spread (min-max). Not asserted.

--alternatives adds three bare arms that price the ways digests could travel: one extra
int64 (N, 4) column per write ("1 column"), per-row tags read back by a kv_list after
each get ("tags+kv_list"), and the guard's own tag entry per row ("digest tags"). dpobs+guard carries them in tags read with the rows' metadata;
"dpobs+guard -fp" is that arm's time minus the guard hooks' own (fingerprint) time; on put
the fingerprint runs beside TransferQueue's row lookup (protocol.OverlapsGuard), so there
"-fp" subtracts time that was partly hidden and is a lower bound of the carrying cost.

--row-age adds the instrumented module with row age on, guard off ("dpobs+age": the stamp is
a tag entry of its own) and guard on ("dpobs+guard+age": one word more in the guard's entry).
"""
from __future__ import annotations

import argparse
import signal
import statistics
import time

import torch
from tensordict import TensorDict

from progress import Progress  # benchmarks/progress.py: the script's folder is on sys.path

import dpobs_otel as dpobs
import dpobs_otel.adapters.transferqueue as dtq
from dpobs_otel.guard import DIGEST_PREFIX
from dpobs_otel.testing.transferqueue import start, stop


def make_batch(n: int) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(200, 312, (n,), generator=g).tolist()
    return TensorDict({
        "tok": torch.nested.nested_tensor([torch.randint(0, 32000, (k,), generator=g)
                                           for k in lengths], layout=torch.jagged),
        "adv": torch.randn(n, 3, generator=g).to(torch.bfloat16),
        "mask": torch.rand(n, 64, generator=g) > 0.5,
        "score": torch.randn(n, generator=g),
    }, batch_size=[n])


def _timeout(signum, frame):
    raise TimeoutError("benchmark ran past its deadline")


def make_arms(tq, td, keys, select, tels, alternatives: bool) -> dict:
    """name -> (put(pid), get(pid)); each arm writes its own partition."""
    def kv(c, extra=None, tags=None, listing=False, tel=None):
        fields = td if extra is None else td.update({"digests": extra}, inplace=False)
        fetch = select if extra is None else select + ["digests"]

        def get(pid):
            out = c.kv_batch_get(keys=keys, partition_id=pid, select_fields=fetch)
            if listing:
                tq.kv_list(pid)
            return out
        return (lambda pid: c.kv_batch_put(keys=keys, partition_id=pid, fields=fields,
                                           tags=tags)), get, tel

    arms = {"bare": kv(tq), "dpobs": kv(dtq.instrument(tels[0])),
            "dpobs+guard": kv(dtq.instrument(tels[1]), tel=tels[1])}
    if len(tels) > 2:  # --row-age
        arms["dpobs+age"] = kv(dtq.instrument(tels[2]))
        arms["dpobs+guard+age"] = kv(dtq.instrument(tels[3]), tel=tels[3])
    if alternatives:
        n = len(keys)
        digests = torch.randint(0, 2**32, (n, len(select)), dtype=torch.int64)
        tags = [{f"__d:{f}": int(d) for f, d in zip(select, row)} for row in digests.tolist()]
        arms["1 column"] = kv(tq, extra=digests)
        arms["tags+kv_list"] = kv(tq, tags=tags, listing=True)
        # The guard's own carriage without the guard: one bytes entry per row, laid out as
        # adapters/transferqueue/digests.py lays it (what carrying the digests costs bare).
        entry = DIGEST_PREFIX + ",".join(select)
        arms["digest tags"] = kv(tq, tags=[{entry: row.numpy().tobytes()} for row in digests])
    return arms


def _guard_s(tel) -> float:
    if tel is None:
        return 0.0
    with tel.stats.lock:
        return tel.stats.instr_seconds.get("guard", 0.0)


def measure(arms: dict, rows: int, iters: int, warmup: int) -> dict:
    """{(op, arm): [ms, ...]}, the arms interleaved call by call, who goes first rotating.
    For the guarded arm also (op, arm + " -fp"): the call minus the guard hooks' own time
    (fingerprints), i.e. what carrying the digests through TransferQueue costs."""
    times = {(op, name): [] for op in ("put", "get") for name in arms}
    progress = Progress(warmup + iters, "iterations")
    for it in range(warmup + iters):
        progress(it)  # before the iteration's timed calls
        order = list(arms.items())
        order = order[it % len(order):] + order[:it % len(order)]
        for op in ("put", "get"):
            for name, (put, get, tel) in order:
                pid = f"bench-{name}"
                g0, t0 = _guard_s(tel), time.perf_counter()
                if op == "put":
                    put(pid)
                else:
                    assert get(pid).batch_size[0] == rows
                dt, dg = time.perf_counter() - t0, _guard_s(tel) - g0
                if it >= warmup:
                    times[(op, name)].append(dt * 1e3)
                    if tel is not None:
                        times.setdefault((op, name + " -fp"), []).append((dt - dg) * 1e3)
    progress(warmup + iters)
    progress.finish()
    return times


def report(runs: list) -> None:
    print(f"{'run':<4} {'op':<4} {'client':<16} {'median ms':>10} {'p90 ms':>8} {'x bare':>7}")
    ratios = {}
    for r, times in enumerate(runs):
        for op in ("put", "get"):
            base = statistics.median(times[(op, "bare")])
            for name in [n for o, n in times if o == op]:
                xs = sorted(times[(op, name)])
                med = statistics.median(xs)
                ratios.setdefault((op, name), []).append(med / base)
                print(f"{r:<4} {op:<4} {name:<16} {med:>10.2f} {xs[int(0.9 * (len(xs) - 1))]:>8.2f}"
                      f" {med / base:>7.3f}")
    print(f"\nover {len(runs)} runs: median of the per-run ratios to bare (min-max)")
    for (op, name), xs in ratios.items():
        if name != "bare":
            print(f"  {op:<4} {name:<16} {statistics.median(xs):.3f}x "
                  f"({min(xs):.3f}-{max(xs):.3f})")


def own_time(tels) -> None:
    """dpobs's own time per op by component (client, guard, adapter), guard off and on."""
    for t, name in zip(tels, ("dpobs", "dpobs+guard", "dpobs+age", "dpobs+guard+age")):
        with t.stats.lock:
            own = dict(t.stats.instr_seconds)
            calls = sum(s.calls for s in t.stats.ops.values())
        parts = ", ".join(f"{c} {v / calls * 1e3:.2f}" for c, v in sorted(own.items()))
        print(f"dpobs's own time per op, {name}: {parts} ms (mean over {calls} ops)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--alternatives", action="store_true")
    ap.add_argument("--row-age", action="store_true", help="add the row-age arms")
    ap.add_argument("--deadline-s", type=int, default=900)
    a = ap.parse_args()
    # TransferQueue's sync calls have no timeout: a watchdog raises, and finally stops Ray.
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(a.deadline_s)

    import transfer_queue as tq

    td = make_batch(a.rows)
    keys = [f"r{i}" for i in range(a.rows)]
    handle = start()
    tels = []
    try:
        arms = ((False, False), (True, False)) + (((False, True), (True, True))
                                                   if a.row_age else ())
        tels = [dpobs.start(role="bench", rank=r, port=0, verify_tensor_hash=g, row_age=age)
                for r, (g, age) in enumerate(arms)]
        arms = make_arms(tq, td, keys, ["tok", "adv", "mask", "score"], tels, a.alternatives)
        runs = [measure(arms, a.rows, a.iters, a.warmup) for _ in range(a.runs)]
        payload = sum(v.values().nbytes if v.is_nested else v.nbytes for v in td.values())
        print(f"TransferQueue 0.1.11, {a.rows} rows ({payload / 1024:.0f} KiB payload), "
              f"{a.runs} run(s) of {a.iters} interleaved iterations after {a.warmup} warm-up; "
              f"ray {handle.timings['ray_init']:.0f} s + tq {handle.timings['tq_init']:.0f} s "
              "to start")
        report(runs)
        own_time(tels)
    finally:
        signal.alarm(0)
        for t in tels:
            t.shutdown()
        stop()


if __name__ == "__main__":
    main()
