"""What the wire guard costs, against the cheapest thing it could have been.

A 1536-row, four-field batch of about 100 MB (jagged int64 tokens, bf16 logprobs, fp32
advantages, bool mask; the per-token fields are rectangular) goes through a put+get cycle of
the instrumented InMemoryDataPlane with verify_tensor_hash on and off; the third arm is two
torch.hash_tensor XOR folds over the same fields (one per side of the wire: per row for the
rectangular fields, over the values buffer for the jagged one, each bit-cast to a same-width
integer since the fold has no float8 kernel). Arms are interleaved round by round so machine
drift hits all three alike; medians are reported, and the ratio

    (on - off) / (two XOR folds)          required <= 2.0, goal <= 1.5

with the spread of that ratio over the rounds (each round's three arms run back to back).

    .venv/bin/python benchmarks/guard.py [--rounds 7] [--threads N]

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
from dpobs_otel import nested
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
        total += nested.values(v).nbytes if v.is_nested else v.nbytes
    return total


_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def xor_fold(td: TensorDict) -> list[torch.Tensor]:
    out = []
    for _, v in td.items():
        if v.is_nested:
            vals = nested.values(v)
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
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: default)")
    ap.add_argument("--fields", action="store_true", help="per-field CPU time, one side")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not hasattr(torch, "hash_tensor"):
        raise SystemExit(f"torch {torch.__version__} has no torch.hash_tensor: no XOR-fold baseline")

    batch = make_batch(args.rows, args.tokens)
    if args.fields:
        return per_field(batch, args.rounds)
    ids = [f"uid-{i}" for i in range(args.rows)]
    tel_on = dpobs.start(role="bench-on", rank=0, port=0, verify_tensor_hash=True)
    tel_off = dpobs.start(role="bench-off", rank=1, port=0, verify_tensor_hash=False)
    on = tel_on.instrument(dpobs.InMemoryDataPlane())
    off = tel_off.instrument(dpobs.InMemoryDataPlane())

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

    arms = {"on": lambda: cycle(on), "off": lambda: cycle(off), "xor2": folds}
    for fn in arms.values():  # warm-up: tables, allocator, page cache
        fn()
    times: dict[str, list[float]] = {k: [] for k in arms}
    cpu: dict[str, list[float]] = {k: [] for k in arms}  # all of this process's threads
    order = list(arms)
    progress = Progress(args.rounds)
    for r in range(args.rounds):
        for name in order[r % 3:] + order[: r % 3]:
            wall, used = arms[name]()
            times[name].append(wall)
            cpu[name].append(used)
        progress(r + 1)  # between rounds, outside every timed arm
    progress.finish()
    cmed = {k: statistics.median(v) for k, v in cpu.items()}
    med = {k: statistics.median(v) for k, v in times.items()}

    def guard_seconds(tel) -> float:
        for family in tel.registry.collect():
            for s in family.samples:
                if s.name == "dpobs_instrumentation_time_seconds_total" and \
                        s.labels.get("component") == "guard":
                    return s.value
        return 0.0

    checked = mism = 0.0
    for family in tel_on.registry.collect():
        for s in family.samples:
            if s.name == "dpobs_guard_rows_checked_total":
                checked += s.value
            if s.name == "dpobs_guard_rows_mismatched_total":
                mism += s.value
    guard_s = guard_seconds(tel_on)
    tel_on.shutdown()
    tel_off.shutdown()

    ratio = (med["on"] - med["off"]) / med["xor2"]
    per_round = sorted((on_ - off_) / x for on_, off_, x in
                       zip(times["on"], times["off"], times["xor2"]))
    q1, q3 = per_round[len(per_round) // 4], per_round[(3 * len(per_round)) // 4]
    print(f"batch: {args.rows} rows, {nbytes(batch) / 1e6:.1f} MB "
          f"(jagged int64 tokens, bf16, fp32, bool); torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {args.rounds} rounds (medians)")
    print(f"  put+get, guard off        {med['off'] * 1e3:9.1f} ms")
    print(f"  put+get, guard on         {med['on'] * 1e3:9.1f} ms")
    print(f"  guard cost (on - off)     {(med['on'] - med['off']) * 1e3:9.1f} ms   "
          f"(the guard's hooks by the core's clock: {guard_s / (args.rounds + 1) * 1e3:.1f} ms/cycle)")
    print(f"  two XOR folds             {med['xor2'] * 1e3:9.1f} ms")
    print(f"  ratio (on - off) / (two XOR folds) = {ratio:.2f}   (required <= 2.0, goal <= 1.5)")
    print(f"  per-round ratios: min {per_round[0]:.2f}  quartiles {q1:.2f} .. {q3:.2f}  "
          f"max {per_round[-1]:.2f}")
    print(f"  CPU time (process, all threads; an OpenMP barrier's spin counts): off "
          f"{cmed['off'] * 1e3:.1f} ms, on {cmed['on'] * 1e3:.1f} ms, two XOR folds "
          f"{cmed['xor2'] * 1e3:.1f} ms, ratio {(cmed['on'] - cmed['off']) / cmed['xor2']:.2f}")
    print(f"  rows checked {checked:.0f}, mismatched {mism:.0f}")


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
