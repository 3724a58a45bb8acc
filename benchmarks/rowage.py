"""Row age's cost on overhead.py's store arm: a put+get of overhead.py's two 256-row batches
("jagged", ~12 MB; "multi", that field and three small ones) on the bare InMemoryDataPlane
(d), and through dpobs with row age off (off) and on (on), each arm its own store,
interleaved round by round with the order rotating so machine drift hits every arm alike.
A clear after each cycle, outside the timed put+get, empties the store.

Prints per shape the medians (ms per put+get) by the wall clock and by this thread's CPU
clock (which a busy machine's preemption does not inflate), and against d (goal <= 1%):
  (on - off) / d   the whole difference, the store's extra work for the stamp included;
                   noisy where the store's own spread is larger than it
  row_age / d      the hooks' own time as dpobs bills it (component=row_age, wall clock)
  alone / d        the row-age work of one put+get repeated on its own by the CPU clock:
                   the hooks (stamp, observe) and the store's (take_stamps, read_stamps),
                   against d's wall median: the figure a busy machine blurs least

    .venv/bin/python benchmarks/rowage.py [--rounds 60]
"""
from __future__ import annotations

import argparse
import statistics
import time

from overhead import ROWS, SHAPES  # benchmarks/overhead.py: this script's folder
from progress import Progress

import dpobs_otel as dpobs
from dpobs_otel.rowage import STAMP
from dpobs_otel.sizing import payload_nbytes
from dpobs_otel.stores.rows import read_stamps, take_stamps

ARMS = ("d", "off", "on")


def cycle(client, ids, batch, select) -> tuple[float, float]:
    """(wall, CPU) seconds of one put+get; the clear after it is not timed."""
    t0, c0 = time.perf_counter(), time.thread_time()
    client.put_samples(ids, "p", batch)
    client.get_samples(ids, "p", select)
    dt, dc = time.perf_counter() - t0, time.thread_time() - c0
    client.clear_samples(ids, "p")
    return dt, dc


def alone(tel, batch, reps: int = 300) -> float:
    """CPU seconds of the row-age work of one put+get, each piece repeated on its own."""
    ra = tel.row_age
    stamped = ra.stamp(batch)
    stamps = take_stamps(stamped)[1]
    read = read_stamps(list(batch.keys()) + [STAMP], lambda: stamps)[1]
    result = batch.copy().set(STAMP, read)
    pieces = [lambda: ra.stamp(batch), lambda: take_stamps(stamped),
              lambda: read_stamps(list(batch.keys()) + [STAMP], lambda: stamps),
              lambda: ra.observe("get", result, None, [], False)]
    total = 0.0
    for piece in pieces:
        piece()
        c0 = time.thread_time()
        for _ in range(reps):
            piece()
        total += (time.thread_time() - c0) / reps
    return total


def billed(tel) -> float:
    with tel.stats.lock:
        return tel.stats.instr_seconds.get("row_age", 0.0)


def run(rounds: int) -> tuple[dict, dict]:
    ids = [f"s{i}" for i in range(ROWS)]
    tels = {"off": dpobs.start(role="bench", rank=0, port=0),
            "on": dpobs.start(role="bench", rank=1, port=0, row_age=True)}
    times = {s: {a: [] for a in ARMS} for s in SHAPES}
    own = {s: 0.0 for s in SHAPES}
    try:
        shapes = {}
        for name, make in SHAPES.items():
            batch = make()
            clients = {"d": dpobs.InMemoryDataPlane()}
            clients.update({a: t.instrument(dpobs.InMemoryDataPlane()) for a, t in tels.items()})
            shapes[name] = (batch, list(batch.keys()), clients)
        for _ in range(3):  # warm-up
            for batch, select, clients in shapes.values():
                for c in clients.values():
                    cycle(c, ids, batch, select)
        progress = Progress(rounds)
        for r in range(rounds):
            for name, (batch, select, clients) in shapes.items():
                order = ARMS[r % 3:] + ARMS[:r % 3]
                for a in order:
                    b0 = billed(tels["on"])
                    times[name][a].append(cycle(clients[a], ids, batch, select))
                    if a == "on":
                        own[name] += billed(tels["on"]) - b0
            progress(r + 1)
        progress.finish()
        solo = {name: alone(tels["on"], batch) for name, (batch, _, _) in shapes.items()}
    finally:
        for t in tels.values():
            t.shutdown()
    return times, {s: v / rounds for s, v in own.items()}, solo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=60)
    args = ap.parse_args()
    times, own, solo = run(args.rounds)
    for name, make in SHAPES.items():
        wall = {a: statistics.median(t[0] for t in times[name][a]) * 1e3 for a in ARMS}
        cpu = {a: statistics.median(t[1] for t in times[name][a]) * 1e3 for a in ARMS}
        print(f"{name}: {ROWS} rows, {payload_nbytes(make()) / 1e6:.1f} MB; {args.rounds} "
              "interleaved rounds; ms per put+get (median), wall / CPU")
        for a in ARMS:
            print(f"  {a:<4} {wall[a]:9.3f} / {cpu[a]:9.3f}")
        print(f"  (on - off) / d = {100 * (wall['on'] - wall['off']) / wall['d']:+.3f}% wall, "
              f"{100 * (cpu['on'] - cpu['off']) / cpu['d']:+.3f}% CPU; row_age / d = "
              f"{100 * own[name] * 1e3 / wall['d']:.3f}% ({own[name] * 1e6:.1f} us billed per "
              "put+get)")
        print(f"  alone / d = {100 * solo[name] * 1e3 / wall['d']:.3f}% "
              f"({solo[name] * 1e6:.1f} us CPU per put+get)  (goal <= 1%)")


if __name__ == "__main__":
    main()
