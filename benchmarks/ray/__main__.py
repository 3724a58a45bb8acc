"""What measuring Ray's object store costs (issue 42), arms interleaved in one run.

Shapes, each a driver-side round trip timed on the driver's wall clock and CPU clock:
  put_get_1k, put_get_1m, put_get_64m   ray.get(ray.put(x)) of a numpy array of that size
  call_1m                               ray.get(sink.echo_len.remote(x)), x 1 MiB by value
  remote_get_64m                        ray.get(ref) of 64 MiB a producer on the second node
                                        made (done before the get: the pull alone is timed)
  actor_start                           a new actor's first call returned, its worker a fresh
                                        process (DPOBS_AUTO=1 in `on`: dpobs starts there on
                                        that call; once a round)
Arms:
  off  Ray as it is: the driver's functions Ray's own, the call to an actor started without
       dpobs;
  on   the driver's functions dpobs's (RayInstrumentor into a started Telemetry), the call to
       an actor started with DPOBS_AUTO=1 (its ray_args and ray_return measured too);
  py   with --python: as `on`, the driver's op path in Python (ops.py's, what runs where
       _fast.c was not built); its actor the same as `on`'s.
Every round runs each shape `reps` times per arm, the arms' order rotating, so drift hits
all alike. Printed per shape and arm: the median per-op wall time, the difference from `off`
in microseconds with the spread of the per-round differences (their 10th-90th percentiles),
the difference as a fraction of the off arm, and the driver's CPU time per op.
Required (issue 54): at most 1% at 1 MiB (goal 0.5%), at most 10 us per op at 1 KiB (goal 5),
at most 1% for the remote get of 64 MiB. The driver runs on a two-node cluster on this
machine (ray.cluster_utils.Cluster, both raylets on 127.0.0.1), its own node the head.

    .venv/bin/python benchmarks/ray [--rounds 15] [--python] [--json OUT]

(A folder run as a script, not benchmarks/ray.py: Python puts a script's own folder first on
sys.path, where a ray.py would stand in for Ray.)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import ray

import dpobs_otel as dpobs
from dpobs_otel.adapters.ray import RayInstrumentor, ops
from dpobs_otel.adapters.ray.ops import Patches
from dpobs_otel.adapters.ray.patching import sites
from dpobs_otel.demo.progress import Line
from dpobs_otel.shims.ray_private import missing

SIZES = {"1k": 1 << 10, "1m": 1 << 20, "64m": 64 << 20}
REPS = {"put_get_1k": 300, "put_get_1m": 60, "put_get_64m": 3, "call_1m": 40,
        "remote_get_64m": 3}
STORE = 512 * 1024**2  # each node's object store


@ray.remote(resources={"node_b": 0.01})
class Producer:
    """On the second node: every object it returns is made there."""
    def make(self, n: int):
        return np.ones(n, dtype=np.uint8)


@ray.remote(resources={"node_a": 0.01})
class Sink:
    """On the driver's node, as on a one-node Ray."""
    def echo_len(self, x):
        return len(x)


@ray.remote(num_cpus=0, resources={"node_a": 0.01})
class Fresh:
    def ready(self):
        return True


# Both arms' actors have an environment the prestarted workers lack, so each start is a new
# process in either arm: what DPOBS_AUTO=1 adds is dpobs starting on the first call.
START_ENV = {"off": {"DPOBS_AUTO": "0"}, "on": {"DPOBS_AUTO": "1", "DPOBS_JOB": "bench-ray"}}


def _actor_start(arm: str) -> None:
    actor = Fresh.options(runtime_env={"env_vars": START_ENV[arm]}).remote()
    ray.get(actor.ready.remote())
    ray.kill(actor)


class Arms:
    """Switches the driver between Ray's functions and dpobs's, attribute by attribute."""

    def __init__(self, tel, python: bool):
        where = [(owner, attr) for owner, attr, _ in sites(Patches(None, None), missing())]
        self.fns = {"off": [(o, a, o.__dict__[a]) for o, a in where]}
        instrumentor = RayInstrumentor()
        instrumentor.instrument(telemetry=tel)
        self.fns["on"] = [(o, a, o.__dict__[a]) for o, a in where]
        if python:  # the same patches made by ops.py's Python path, around Ray's own
            saved = ops.FAST, ops.Frame
            ops.FAST, ops.Frame = None, ops.PyFrame
            try:
                patches = Patches(instrumentor._per_process, lambda exc: None)
                self.fns["py"] = [(o, a, make(plain)) for (o, a, make), (_, _, plain)
                                  in zip(sites(patches, missing()), self.fns["off"])]
            finally:
                ops.FAST, ops.Frame = saved

    def use(self, arm: str) -> None:
        for owner, attr, fn in self.fns[arm]:
            setattr(owner, attr, fn)


def _op(shape: str, sinks: dict, arm: str, data: dict):
    if shape == "remote_get_64m":  # a fresh object each get, made and done before it
        refs = []

        def get():
            if not refs:
                refs.extend(sinks["producer"].make.remote(SIZES["64m"])
                            for _ in range(REPS[shape] + 1))
                ray.wait(refs, num_returns=len(refs), fetch_local=False)
            ray.get(refs.pop())
        return get
    if shape.startswith("put_get"):
        x = data[shape.rsplit("_", 1)[1]]
        return lambda: ray.get(ray.put(x))
    sink, x = sinks["off" if arm == "off" else "on"], data["1m"]
    return lambda: ray.get(sink.echo_len.remote(x))


def _timed(fn, reps: int) -> tuple[float, float]:
    """(wall, CPU) seconds per op over `reps` calls."""
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - w0) / reps, (time.process_time() - c0) / reps


def measure(arms: Arms, sinks: dict, rounds: int) -> dict:
    data = {k: np.random.default_rng(0).integers(0, 255, n, dtype=np.uint8)
            for k, n in SIZES.items()}
    names = list(arms.fns)
    times = {s: {arm: [] for arm in names} for s in REPS}
    times["actor_start"] = {arm: [] for arm in START_ENV}
    progress = Line(sys.stderr)
    for r in range(rounds):
        for shape, reps in REPS.items():
            for arm in names[r % len(names):] + names[:r % len(names)]:
                arms.use(arm)
                op = _op(shape, sinks, arm, data)
                op()  # warm: the first call of an arm after a switch
                times[shape][arm].append(_timed(op, reps))
        for arm in list(START_ENV)[r % 2:] + list(START_ENV)[:r % 2]:
            arms.use(arm)
            times["actor_start"][arm].append(_timed(lambda: _actor_start(arm), 1))
        arms.use("off")
        progress.show(f"{r + 1}/{rounds} rounds")
    progress.finish()
    return times


def report(times: dict) -> dict:
    out = {}
    print(f"{'shape':<15}{'arm':<5}{'off us':>10}{'arm us':>10}{'diff us':>10}{'p10..p90':>22}"
          f"{'diff %':>9}{'cpu off':>10}{'cpu arm':>9}")
    for shape, arms in times.items():
        off = [w for w, _ in arms["off"]]
        for arm in [a for a in arms if a != "off"]:
            on = [w for w, _ in arms[arm]]
            diffs = sorted(b - a for a, b in zip(off, on))
            q = statistics.quantiles(diffs, n=10) if len(diffs) > 1 else diffs * 9
            row = {"off_us": statistics.median(off) * 1e6, "on_us": statistics.median(on) * 1e6,
                   "diff_us": statistics.median(diffs) * 1e6, "p10_us": q[0] * 1e6,
                   "p90_us": q[-1] * 1e6,
                   "cpu_off_us": statistics.median(c for _, c in arms["off"]) * 1e6,
                   "cpu_on_us": statistics.median(c for _, c in arms[arm]) * 1e6}
            row["diff_frac"] = row["diff_us"] / row["off_us"]
            out[shape if arm == "on" else f"{shape}/{arm}"] = row
            print(f"{shape:<15}{arm:<5}{row['off_us']:>10.1f}{row['on_us']:>10.1f}"
                  f"{row['diff_us']:>10.1f}{row['p10_us']:>11.1f}..{row['p90_us']:<9.1f}"
                  f"{row['diff_frac']:>9.2%}{row['cpu_off_us']:>10.1f}{row['cpu_on_us']:>9.1f}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--python", action="store_true",
                        help="a third arm: the driver's op path in Python (ops.py's)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    os.environ.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    from ray.cluster_utils import Cluster
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": False,
        "object_store_memory": STORE, "resources": {"node_a": 1}})
    cluster.add_node(num_cpus=1, resources={"node_b": 1}, node_ip_address="127.0.0.1",
                     object_store_memory=STORE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    tel = dpobs.start(role="bench-driver", job="bench-ray", port=0)
    try:
        sinks = {"off": Sink.remote(),
                 "on": Sink.options(runtime_env={"env_vars": {
                     "DPOBS_AUTO": "1", "DPOBS_JOB": "bench-ray"}}).remote(),
                 "producer": Producer.remote()}
        ray.get([s.echo_len.remote(b"") for k, s in sinks.items() if k != "producer"]
                + [sinks["producer"].make.remote(1)])
        arms = Arms(tel, args.python)
        figures = report(measure(arms, sinks, args.rounds))
    finally:
        RayInstrumentor().uninstrument()
        tel.shutdown()
        ray.shutdown()
        cluster.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
