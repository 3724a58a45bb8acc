"""What DPOBS_AUTO=1 adds to verl's own four-worker start (issue 54): verl 0.9's
tests/single_controller/test_ray_local_envs_on_cpu.py (verl's wheel ships its tests as the
top-level package `tests`), run whole by pytest in a fresh process per arm and round, plain
and under DPOBS_AUTO=1, the arms' order alternating round by round. Each run starts its own
Ray and two RayWorkerGroups of four actors, so what dpobs adds to a worker's start is most
of what differs. Printed: each arm's median wall time, the median per-round difference with
its spread (smallest..largest), and that difference as a fraction of plain. Bar: at most 5%.

    unshare --net sh -c 'ip link set lo up && exec .venv/bin/python benchmarks/verl_start.py'
        [--rounds 4]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

TEST = Path(sysconfig.get_paths()["purelib"]) / "tests" / "single_controller" / \
    "test_ray_local_envs_on_cpu.py"
ARMS = {"plain": {}, "DPOBS_AUTO=1": {"DPOBS_AUTO": "1", "DPOBS_JOB": "bench-verl"}}


def run(env_extra: dict, where: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPOBS_")}
    env.update(env_extra, RAY_USAGE_STATS_ENABLED="0")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "--rootdir", where, str(TEST)], cwd=where, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args(argv)
    if not TEST.is_file():
        sys.exit(f"verl's test is not installed here: {TEST}")
    times = {arm: [] for arm in ARMS}
    names = list(ARMS)
    with tempfile.TemporaryDirectory() as where:
        for r in range(args.rounds):
            for arm in names[r % 2:] + names[:r % 2]:
                times[arm].append(run(ARMS[arm], where))
                print(f"round {r + 1} {arm}: {times[arm][-1]:.1f} s", file=sys.stderr)
    plain, on = times["plain"], times["DPOBS_AUTO=1"]
    diffs = sorted(b - a for a, b in zip(plain, on))
    base = statistics.median(plain)
    print(f"plain {base:.1f} s, DPOBS_AUTO=1 {statistics.median(on):.1f} s, difference "
          f"{statistics.median(diffs):+.1f} s ({diffs[0]:+.1f}..{diffs[-1]:+.1f}), "
          f"{statistics.median(diffs) / base:+.1%} of plain, {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
