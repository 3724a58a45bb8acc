"""P5: the demo's step time with dpobs on versus off.

The multi-process demo workload (rollout, trainers, driver on the shared store) runs with
every measured step paired with its neighbour: one of each pair with dpobs (instrumented
client, tel.step(), tel.codec()), the other with the raw store client and nothing of dpobs,
in a seeded random order. A step's time is its full cycle, barrier to barrier across all
processes. Prints the median paired ratio on/off (goal: <= 1.01) with its interquartile
range, and the per-arm medians.

    .venv/bin/python benchmarks/demo_overhead.py [--steps 400] [demo workload flags]
"""
from __future__ import annotations

import argparse
import statistics
import sys

from dpobs_otel.demo import report as demo
from dpobs_otel.demo.progress import Progress
from dpobs_otel.demo.workload import Workload


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    demo.add_arguments(p)  # the demo's workload flags; the stack is never started here
    p.set_defaults(steps=400)
    args = p.parse_args(argv)
    cfg = demo.config(args)
    cfg.alternate, cfg.duration, cfg.sd_dir, cfg.corrupt_at = True, None, None, None
    cycles: dict[int, tuple[float, bool]] = {}
    progress = Progress(cfg)  # the parent's line on stderr; the steps run elsewhere

    def on_step(step, dt, elapsed, on):
        cycles[step] = (dt, on)
        progress(step, dt, elapsed)

    with Workload(cfg) as wl:
        wl.warmup()
        wl.run(on_step)
    progress.finish()
    ratios, on_s, off_s = [], [], []
    for first in range(1, cfg.steps, 2):
        pair = [cycles.get(first), cycles.get(first + 1)]
        if None in pair:
            continue
        on = next(dt for dt, m in pair if m)
        off = next(dt for dt, m in pair if not m)
        ratios.append(on / off)
        on_s.append(on)
        off_s.append(off)
    if not ratios:
        print("no complete pairs", file=sys.stderr)
        return 1
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    print(f"demo step cycle, {len(ratios)} pairs ({cfg.trainers} trainers, batch "
          f"{cfg.batch_size}, lengths {cfg.min_len}-{cfg.max_len}, store latency "
          f"{cfg.latency_s * 1e3:g} ms, guard {'on' if cfg.verify else 'off'})")
    print(f"  {'arm':<12}{'median step ms':>16}")
    for arm, xs in (("dpobs on", on_s), ("dpobs off", off_s)):
        print(f"  {arm:<12}{statistics.median(xs) * 1e3:>16.2f}")
    print(f"  median paired ratio on/off: {med:.4f}  (IQR {q1:.4f}-{q3:.4f}; goal <= 1.01)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
