"""put / get latency on a live TransferQueue, bare vs through dpobs (guard off / on).

    .venv/bin/python benchmarks/transferqueue.py [--rows 256] [--iters 30]

Starts a private local Ray + TransferQueue (one storage unit, num_cpus=2; tests/adapters/tq_harness.py)
and stops it at the end. A 256-row batch shaped like a GRPO rollout (jagged int64 tokens of
200-311, a bf16 (N, 3), a bool (N, 64) mask, a float32 (N,) score) is put and read back
(select_fields = the tensor fields) by three clients, interleaved call by call so drift on a
shared machine hits all three alike (who goes first rotates): the bare transfer_queue module,
the instrumented one, and the instrumented one with verify_tensor_hash. Each client writes its
own partition.
Prints medians and p90 in ms, and the median overhead against the bare call. Not asserted.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time

import torch
from tensordict import TensorDict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "adapters"))
from tq_harness import start, stop  # noqa: E402

import dpobs_otel as dpobs  # noqa: E402
import dpobs_otel.adapters.transferqueue as dtq  # noqa: E402


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--deadline-s", type=int, default=900)
    a = ap.parse_args()
    # TransferQueue's sync calls have no timeout: a watchdog raises, and finally stops Ray.
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(a.deadline_s)

    import transfer_queue as tq

    td = make_batch(a.rows)
    keys = [f"r{i}" for i in range(a.rows)]
    select = ["tok", "adv", "mask", "score"]
    handle = start()
    tels = []
    try:
        tels = [dpobs.start(role="bench", rank=r, port=0, verify_tensor_hash=g)
                for r, g in ((0, False), (1, True))]
        clients = {"bare": tq, "dpobs": dtq.instrument(tels[0]),
                   "dpobs+guard": dtq.instrument(tels[1])}
        times = {(op, c): [] for op in ("put", "get") for c in clients}
        for it in range(a.warmup + a.iters):
            # Rotate who goes first each iteration: no client always follows the same one.
            order = list(clients.items())
            order = order[it % 3:] + order[:it % 3]
            for op in ("put", "get"):
                for name, c in order:
                    pid = f"bench-{name}"
                    t0 = time.perf_counter()
                    if op == "put":
                        c.kv_batch_put(keys=keys, partition_id=pid, fields=td)
                    else:
                        out = c.kv_batch_get(keys=keys, partition_id=pid, select_fields=select)
                        assert out.batch_size[0] == a.rows
                    dt = time.perf_counter() - t0
                    if it >= a.warmup:
                        times[(op, name)].append(dt * 1e3)
        payload = sum(v.values().nbytes if v.is_nested else v.nbytes for v in td.values())
        print(f"TransferQueue 0.1.11, {a.rows} rows ({payload / 1024:.0f} KiB payload), "
              f"{a.iters} interleaved iterations after {a.warmup} warm-up; "
              f"ray {handle.timings['ray_init']:.0f} s + tq {handle.timings['tq_init']:.0f} s "
              "to start")
        print(f"{'op':<4} {'client':<12} {'median ms':>10} {'p90 ms':>8} {'overhead':>16}")
        for op in ("put", "get"):
            base = statistics.median(times[(op, "bare")])
            for name in clients:
                xs = sorted(times[(op, name)])
                med = statistics.median(xs)
                p90 = xs[int(0.9 * (len(xs) - 1))]
                over = "" if name == "bare" else f"{med - base:+.2f} ms {med / base:5.2f}x"
                print(f"{op:<4} {name:<12} {med:>10.2f} {p90:>8.2f} {over:>16}")
        # Where the guard's extra time goes: its own CPU (fingerprints) vs TransferQueue
        # carrying the digest columns (one more field per tensor field, stored row by row).
        for t, name in zip(tels, ("dpobs", "dpobs+guard")):
            with t.stats.lock:
                own = dict(t.stats.instr_seconds)
                calls = sum(s.calls for s in t.stats.ops.values())
            parts = ", ".join(f"{c} {v / calls * 1e3:.2f}" for c, v in sorted(own.items()))
            print(f"dpobs's own time per op, {name}: {parts} ms (mean over {calls} ops)")
    finally:
        signal.alarm(0)
        for t in tels:
            t.shutdown()
        stop()


if __name__ == "__main__":
    main()
