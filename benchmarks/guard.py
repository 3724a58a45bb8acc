"""What the wire guard costs, against the cheapest thing it could have been.

A 1536-row, four-field batch of about 100 MB (jagged int64 tokens, bf16 logprobs, fp32
advantages, bool mask; the per-token fields are rectangular) goes through a put+get cycle of
the instrumented InMemoryDataPlane with verify_tensor_hash on and off; the third arm is two
torch.hash_tensor XOR folds over the same fields (one per side of the wire: per row for the
rectangular fields, over the values buffer for the jagged one, each bit-cast to a same-width
integer since the fold has no float8 kernel). Arms are interleaved round by round so machine
drift hits all three alike; medians are reported, and the ratio

    (on - off) / (two XOR folds)          required <= 2.0, goal <= 1.5

with the spread of that ratio over the rounds (each round's three arms run back to back),
by both clocks.

    .venv/bin/python benchmarks/guard.py [--rounds 7] [--threads N[,M...]]

Both clocks are reported: wall (perf_counter, what the user waits on) and CPU (process_time,
every thread of the process). `--threads 1,2` sweeps torch's intra-op thread count (the folds'
and the caller's, which the guard's helpers follow), interleaved round by round with the arms.

`--fields` instead compares the fingerprint with the fold field by field: CPU time of one side
(field_digests against torch.hash_tensor per field), interleaved, medians.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel.shims import torch_jagged
from progress import Progress  # benchmarks/progress.py: this script's folder

ROWS = 1536
TOKENS = 4352  # mean row length: 1536 * 4352 * (8 + 2 + 4 + 1) bytes = 100 MB


def make_batch(rows: int = ROWS, tokens: int = TOKENS) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(tokens // 2, tokens * 3 // 2 + 1, (rows,), generator=g).tolist()
    tok = torch.nested.nested_tensor([torch.randint(0, 150_000, (n,), generator=g)
                                      for n in lengths], layout=torch.jagged)
    return TensorDict({
        "input_ids": tok,
        "logprobs": torch.randn(rows, tokens, generator=g).to(torch.bfloat16),
        "advantages": torch.randn(rows, 1, generator=g).expand(rows, tokens).contiguous(),
        "mask": torch.rand(rows, tokens, generator=g) > 0.2,
    }, batch_size=[rows])


def nbytes(td: TensorDict) -> int:
    total = 0
    for _, v in td.items():
        total += torch_jagged.values(v).nbytes if v.is_nested else v.nbytes
    return total


_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def xor_fold(td: TensorDict) -> list[torch.Tensor]:
    out = []
    for _, v in td.items():
        if v.is_nested:
            vals = torch_jagged.values(v)
            out.append(torch.hash_tensor(vals.view(_INT[vals.element_size()])))
        else:
            out.append(torch.hash_tensor(v.view(_INT[v.element_size()]).reshape(v.shape[0], -1),
                                         dim=1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rows", type=int, default=ROWS)
    ap.add_argument("--tokens", type=int, default=TOKENS)
    ap.add_argument("--threads", default="0",
                    help="torch intra-op threads, comma-separated to sweep (0: default)")
    ap.add_argument("--fields", action="store_true", help="per-field CPU time, one side")
    args = ap.parse_args()
    default = torch.get_num_threads()
    sweep = [int(t) or default for t in args.threads.split(",")]
    if not hasattr(torch, "hash_tensor"):
        raise SystemExit(f"torch {torch.__version__} has no torch.hash_tensor: no XOR-fold baseline")
    batch = make_batch(args.rows, args.tokens)
    if args.fields:
        torch.set_num_threads(sweep[0])
        return per_field(batch, args.rounds)
    print(f"batch: {args.rows} rows, {nbytes(batch) / 1e6:.1f} MB "
          f"(jagged int64 tokens, bf16, fp32, bool); torch {torch.__version__}, default "
          f"{default} threads, {args.rounds} rounds (medians), threads {sweep} interleaved")
    tel_on = dpobs.start(role="bench-on", rank=0, port=0, verify_tensor_hash=True)
    tel_off = dpobs.start(role="bench-off", rank=1, port=0, verify_tensor_hash=False)
    arms = make_arms(batch, [f"uid-{i}" for i in range(args.rows)],
                     tel_on.instrument(dpobs.InMemoryDataPlane()),
                     tel_off.instrument(dpobs.InMemoryDataPlane()))
    on_cycle = arms["on"]

    def on_and_hooks():  # the hooks' own seconds, read outside the timed cycle
        before = guard_seconds(tel_on)
        w, c = on_cycle()
        hooks[torch.get_num_threads()].append(guard_seconds(tel_on) - before)
        return w, c

    hooks: dict[int, list[float]] = {t: [] for t in sweep}
    arms["on"] = on_and_hooks
    wall, cpu = measure(arms, sweep, args.rounds)
    for threads in dict.fromkeys(sweep):
        report(threads, wall[threads], cpu[threads], hooks[threads][-args.rounds:])
    print(f"  rows checked {sample_sum(tel_on, 'dpobs_guard_rows_checked_total'):.0f}, "
          f"mismatched {sample_sum(tel_on, 'dpobs_guard_rows_mismatched_total'):.0f}")
    tel_on.shutdown()
    tel_off.shutdown()


def make_arms(batch: TensorDict, ids: list[str], on, off) -> dict:
    """The three arms, each returning (wall, CPU) seconds: CPU is time.process_time(), every
    thread of this process (the guard's helpers included, and an OpenMP barrier's spin)."""
    def cycle(client) -> tuple[float, float]:
        t, c = time.perf_counter(), time.process_time()
        client.put_samples(ids, "bench", batch)
        got = client.get_samples(ids, "bench")
        dt, dc = time.perf_counter() - t, time.process_time() - c
        assert set(got.keys()) == set(batch.keys())
        client.clear_samples(ids, "bench")
        return dt, dc

    def folds() -> tuple[float, float]:
        t, c = time.perf_counter(), time.process_time()
        xor_fold(batch)  # the writer's side
        xor_fold(batch)  # the reader's side
        return time.perf_counter() - t, time.process_time() - c

    return {"on": lambda: cycle(on), "off": lambda: cycle(off), "xor2": folds}


def measure(arms: dict, sweep: list[int], rounds: int) -> tuple[dict, dict]:
    """wall[threads][arm], cpu[threads][arm]: one list entry per round. Each round runs every
    thread count, and at each the three arms back to back, orders rotated round by round."""
    wall = {t: {k: [] for k in arms} for t in sweep}
    cpu = {t: {k: [] for k in arms} for t in sweep}
    for threads in dict.fromkeys(sweep):  # warm-up: tables, allocator, OpenMP's threads
        torch.set_num_threads(threads)
        for fn in arms.values():
            fn()
    order, counts = list(arms), list(dict.fromkeys(sweep))
    progress = Progress(rounds)
    for r in range(rounds):
        for threads in counts[r % len(counts):] + counts[:r % len(counts)]:
            torch.set_num_threads(threads)
            for name in order[r % 3:] + order[: r % 3]:
                w, c = arms[name]()
                wall[threads][name].append(w)
                cpu[threads][name].append(c)
        progress(r + 1)  # between rounds, outside every timed arm
    progress.finish()
    return wall, cpu


def _ratios(times: dict) -> tuple[float, list[float]]:
    """(on - off) / xor2 of the medians, and every round's own ratio, sorted."""
    med = {k: statistics.median(v) for k, v in times.items()}
    per_round = sorted((a - b) / x for a, b, x in zip(times["on"], times["off"], times["xor2"]))
    return (med["on"] - med["off"]) / med["xor2"], per_round


def report(threads: int, wall: dict, cpu: dict, hooks: list[float]) -> None:
    print(f"{threads} threads:")
    alone = sorted(h / x for h, x in zip(hooks, wall["xor2"]))
    print(f"  hooks alone (the guard's own wall time by the core's clock, no store): "
          f"{statistics.median(hooks) * 1e3:.1f} ms, / two XOR folds: {statistics.median(alone):.2f}"
          f" (quartiles {alone[len(alone) // 4]:.2f} .. {alone[(3 * len(alone)) // 4]:.2f})")
    for clock, times in (("wall", wall), ("CPU ", cpu)):
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        ratio, rounds = _ratios(times)
        q1, q3 = rounds[len(rounds) // 4], rounds[(3 * len(rounds)) // 4]
        print(f"  {clock}  off {med['off']:7.1f} ms  on {med['on']:7.1f} ms  "
              f"(on - off) {med['on'] - med['off']:6.1f} ms  two XOR folds {med['xor2']:6.1f} ms"
              f"   ratio {ratio:5.2f}  (rounds: quartiles {q1:.2f} .. {q3:.2f}, "
              f"min {rounds[0]:.2f}, max {rounds[-1]:.2f})")
    print("        ratio = (on - off) / (two XOR folds): required <= 2.0 wall, <= 1.5 CPU; "
          "goal <= 1.5 wall")


def sample_sum(tel, name: str, component: str | None = None) -> float:
    total = 0.0
    for family in tel.registry.collect():
        for s in family.samples:
            if s.name == name and (component is None or s.labels.get("component") == component):
                total += s.value
    return total


def guard_seconds(tel) -> float:
    return sample_sum(tel, "dpobs_instrumentation_time_seconds_total", "guard")


def per_field(batch: TensorDict, rounds: int) -> None:
    from dpobs_otel.guard.fingerprint import field_digests, id_salts

    salts = id_salts([f"uid-{i}" for i in range(batch.batch_size[0])], "bench")
    arms = {}
    for name, value in batch.items():
        arms[(name, "fp")] = lambda v=value, n=name: field_digests(v, n, salts)
        arms[(name, "xor")] = lambda td=batch.select(name): xor_fold(td)
    for fn in arms.values():
        fn()
    cpu: dict = {k: [] for k in arms}
    for _ in range(rounds):
        for key, fn in arms.items():
            t = time.process_time()
            fn()
            cpu[key].append(time.process_time() - t)
    med = {k: statistics.median(v) * 1e3 for k, v in cpu.items()}
    print(f"CPU ms of one side, medians of {rounds} rounds, {torch.get_num_threads()} threads")
    for name in list(batch.keys()) + ["all"]:
        f = med[(name, "fp")] if name != "all" else sum(v for (n, a), v in med.items() if a == "fp")
        x = med[(name, "xor")] if name != "all" else sum(v for (n, a), v in med.items() if a == "xor")
        print(f"  {name:12s} fingerprint {f:7.2f}   xor fold {x:7.2f}   ratio {f / x:5.2f}")


if __name__ == "__main__":
    main()
