"""P1 of this tree against another checkout of dpobs (main, say), A/B in one run.

Both packages are called dpobs_otel, so one process cannot hold both: this runs
benchmarks/overhead.py in alternating child processes, PYTHONPATH pointing at each tree's
package in turn (this tree's benchmark script either way), pair after pair, so machine drift
hits both sides alike. Prints each side's median P1 ((c-a)/(b-a)), the non-sizing ratio and
the cost per op, per shape, and the difference.

    git worktree add /tmp/dpobs-main main
    .venv/bin/python benchmarks/ab.py --base /tmp/dpobs-main [--pairs 5] [--rounds 150]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
METRICS = ("p1", "p1_no_sizing", "cost_us")


def once(tree: Path, rounds: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        subprocess.run([sys.executable, str(HERE / "overhead.py"), "--rounds", str(rounds),
                        "--json", out.name], env=env, check=True, stdout=subprocess.DEVNULL)
        return json.load(open(out.name))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the other checkout (its root folder)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=150)
    args = ap.parse_args()
    sides = {"this": HERE.parent, "base": Path(args.base).resolve()}
    runs: dict[str, list[dict]] = {k: [] for k in sides}
    for i in range(args.pairs):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for side in order:
            runs[side].append(once(sides[side], args.rounds))
        print(f"pair {i + 1}/{args.pairs} done", file=sys.stderr)
    for shape in runs["this"][0]:
        print(f"{shape}: median of {args.pairs} runs each, {args.rounds} rounds a run")
        for m in METRICS:
            a, b = ([r[shape][m] for r in runs[s]] for s in ("this", "base"))
            ma, mb = statistics.median(a), statistics.median(b)
            print(f"  {m:<13} this {ma:7.3f} (spread {min(a):.3f}-{max(a):.3f})   base {mb:7.3f}"
                  f" (spread {min(b):.3f}-{max(b):.3f})   this - base {ma - mb:+.3f}")


if __name__ == "__main__":
    main()
