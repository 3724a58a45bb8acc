"""One tel.cluster_step_metrics call at 64 endpoints, three ways to read the endpoints, arms
alternated round by round on the same live endpoints (benchmarks/cluster_step.py's hosts):

    one   this tree: one protobuf request per endpoint (counters and native histograms)
    two   FileSDSource as it was at --before (default 80c0137, before the one request): a
          text request per endpoint, then a protobuf request for the native histograms
    text  one text request per endpoint (no native histograms: the floor)

Printed: each arm's median and 90th percentile call time, and the ratios two/one and
one/text (ratios, not times, are what carries over to another box).

    .venv/bin/python benchmarks/cluster_fetch_ab.py [--rounds 20] [--before 80c0137]
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time

import cluster_step  # the script's own folder is first on the path: its sibling


def sources_at(rev: str):
    """readback/sources.py of another revision, loaded against this tree's readback."""
    src = subprocess.check_output(["git", "show", f"{rev}:dpobs_otel/readback/sources.py"])
    spec = importlib.util.spec_from_loader("dpobs_otel.readback._sources_before", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "dpobs_otel.readback"
    sys.modules[spec.name] = mod
    exec(src, mod.__dict__)
    return mod


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--before", default="80c0137")
    args = p.parse_args(argv)
    from dpobs_otel.readback import protobody, scrape
    from dpobs_otel.readback.cluster import ClusterView

    with tempfile.TemporaryDirectory(prefix="dpobs-bench-") as root:
        procs, dirs = cluster_step.start_hosts(root, 8)
        try:
            d = dirs[64]
            views = {k: ClusterView(d, "dpobs-bench", 2.0) for k in ("one", "two", "text")}
            views["two"].source = sources_at(args.before).FileSDSource(d, "dpobs-bench", 2.0)
            one = protobody.read

            def text(t, timeout, ctx):
                return scrape.scrape(t, timeout, ctx), None
            times = {k: [] for k in views}
            order = list(views)
            for r in range(args.rounds + 2):  # the first two rounds warm up
                for name in order[r % 3:] + order[:r % 3]:
                    protobody.read = text if name == "text" else one
                    t0 = time.perf_counter()
                    views[name].step_metrics()
                    if r >= 2:
                        times[name].append(1e3 * (time.perf_counter() - t0))
                    protobody.read = one
        finally:
            for proc in procs:
                proc.stdin.close()
            for proc in procs:
                proc.wait(timeout=60)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:>5}  median {med[k]:6.1f} ms  p90 {sorted(v)[int(0.9 * (len(v) - 1))]:6.1f} ms")
    print(f"two/one {med['two'] / med['one']:.2f}   one/text {med['one'] / med['text']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
