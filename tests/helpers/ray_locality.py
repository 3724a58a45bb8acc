"""Ray's moving-data part and locality on a live two-node Ray cluster on this machine
(ray.cluster_utils.Cluster: node A, the head, and node B, each its own raylet and object store
on 127.0.0.1). Two programs:

    python -m helpers.ray_locality --cluster INFO.json # the cluster up, INFO.json written
                                                       # ({address, a, b}: NodeIDs), held
                                                       # until stdin closes, then down
    RAYLOC_ADDRESS=... python -m helpers.ray_locality OUT.json
                                                       # a driver on node A (the
                                                       # environment says whether dpobs is on)

The driver's scenarios, each with its own truth: Ray's get_object_locations before the get
(sizes, where the object was), the test's own clock around each get, a digest of every
value. Under DPOBS_AUTO=1 it scrapes its own dpobs target (and the workers', registered in
DPOBS_SD_DIR) before and after each scenario, so the test holds the deltas against the truth.
Run by tests/adapters/ray/test_ray_locality.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import ray

from helpers.ray_job import scrape_all
from helpers.ray_runs import forwarded

MIB = 1024 * 1024
SLOW_S = 2.0  # how long the slow producer runs before its object exists
STORE = 100 * MIB
SPILL_N = 12  # puts of 10 MiB: past node A's store, so the first is spilled


@ray.remote
class Producer:
    """Pinned by a node's resource on the node the driver is not on (scenarios): every
    object it returns is made there."""
    def make(self, n: int, delay: float = 0.0) -> bytes:
        time.sleep(delay)
        return bytes(range(256)) * (n // 256)

    def length(self, value) -> int:  # an argument pulled to node B (by the worker's Ray)
        return len(value)


def cluster(info: Path) -> None:
    from ray.cluster_utils import Cluster
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": STORE,
        "include_dashboard": False, "resources": {"node_a": 4}})
    b = c.add_node(num_cpus=2, resources={"node_b": 4}, node_ip_address="127.0.0.1",
                   object_store_memory=STORE)
    c.wait_for_nodes()
    info.write_text(json.dumps({"address": c.address, "a": c.head_node.node_id,
                                "b": b.node_id}))
    try:
        sys.stdin.read()  # until the test closes it
    finally:
        c.shutdown()


def _truth(ref) -> dict:
    """Ray's own word (an RPC to the owner): where the object is and its size."""
    loc = ray.experimental.get_object_locations([ref])[ref]
    return {"size": int(loc["object_size"]), "nodes": list(loc["node_ids"])}


def _timed_get(refs) -> tuple[list | bytes, float]:
    t0 = time.perf_counter()
    value = ray.get(refs)
    return value, time.perf_counter() - t0


def _scrape() -> list[dict]:
    return scrape_all(os.environ.get("DPOBS_SD_DIR"))


def _elsewhere(here: str) -> tuple[str, str]:
    """(the NodeID of the node this driver is not on, the resource that pins an actor
    there). Both raylets are on 127.0.0.1: Ray 2.60 attaches a driver to the head, 2.49 to
    either one."""
    for node in ray.nodes():
        if node["Alive"] and node["NodeID"] != here:
            return node["NodeID"], next(r for r in node["Resources"] if r.startswith("node_"))
    raise RuntimeError("the cluster has one node")


def scenarios() -> dict:
    here = ray.get_runtime_context().get_node_id()
    there, pin = _elsewhere(here)
    out: dict = {"node": here, "there": there, "steps": {}}
    digest = hashlib.sha256()
    producer = Producer.options(resources={pin: 0.01}).remote()
    ray.get(producer.make.remote(256))  # the actor up on node B before anything is timed

    def step(name, fn):
        before = _scrape()
        truth = fn()
        out["steps"][name] = {"truth": truth, "before": before, "after": _scrape()}

    def remote():  # made on B, done before the get: pulled to A
        ref = producer.make.remote(4 * MIB)
        ray.wait([ref], fetch_local=False)
        truth = _truth(ref)
        value, dt = _timed_get(ref)
        digest.update(value)
        remote.ref = ref
        return {**truth, "dt": dt}

    def again():  # the same object again: now in A's store
        value, dt = _timed_get(remote.ref)
        digest.update(value)
        return {**_truth(remote.ref), "dt": dt}

    def slow():  # a get that waits for its producer: the wait is no data time
        ref = producer.make.remote(4 * MIB, SLOW_S)
        value, dt = _timed_get(ref)
        digest.update(value)
        return {**_truth(ref), "dt": dt}

    def mixed():  # one object here (put), one on B: bytes split by where each was
        here = ray.put(bytes(3 * MIB))
        there = producer.make.remote(2 * MIB)
        ray.wait([there], fetch_local=False)
        truth = {"here": _truth(here), "there": _truth(there)}
        values, dt = _timed_get([here, there])
        for v in values:
            digest.update(v)
        return {**truth, "dt": dt}

    def argument():  # an object of A's handed to a method on B: the worker pulls it
        ref = ray.put(bytes(range(256)) * (5 * MIB // 256))
        truth = _truth(ref)
        n = ray.get(producer.length.remote(ref))
        digest.update(n.to_bytes(8, "little"))
        return truth

    def spilled():  # more than node A's store holds: Ray spills the first to disk
        refs = [ray.put(bytes([i]) * (10 * MIB)) for i in range(SPILL_N)]
        truth = _truth(refs[0])
        truth["did_spill"] = bool(ray.experimental.get_local_object_locations(
            [refs[0]])[refs[0]]["did_spill"])
        value, dt = _timed_get(refs[0])
        digest.update(value)
        again = ray.get(refs[0])  # restored by the first get: here now
        digest.update(again)
        return {**truth, "dt": dt}

    for name, fn in (("remote", remote), ("again", again), ("slow", slow),
                     ("mixed", mixed), ("argument", argument), ("spilled", spilled)):
        step(name, fn)
    tel = _telemetry()
    if tel is not None:
        out["step_metrics"] = _steps(tel, producer)
    out["digest"] = digest.hexdigest()
    # With the off switch on nothing of dpobs's Ray side is loaded, nor in Ray's place.
    out["loaded"] = sorted(m for m in sys.modules if m.startswith("dpobs_otel.adapters.ray."))
    out["ray_get_is_rays"] = "dpobs_otel" not in ray.get.__code__.co_filename
    return out


def _telemetry():
    """The Telemetry DPOBS_AUTO started in this driver (None: dpobs is off)."""
    if "dpobs_otel.adapters.instrumentation" not in sys.modules:
        return None
    from dpobs_otel.adapters.instrumentation import _LIVE
    return next((p.telemetry() for p in list(_LIVE) if p.telemetry() is not None), None)


def _steps(tel, producer) -> dict:
    """Two training steps, each one get of 4 MiB made on node B: one that waits SLOW_S for
    its producer, one whose producer was done before the step. Each step's step_metrics()
    with the driver's own clock of the get beside it."""
    out = {}
    tel.step_metrics()  # the window starts here
    for name, delay in (("waited", SLOW_S), ("done", 0.0)):
        ref = producer.make.remote(4 * MIB, delay)
        if not delay:
            ray.wait([ref], fetch_local=False)
        with tel.step():
            t0 = time.perf_counter()
            ray.get(ref)
            dt = time.perf_counter() - t0
        out[name] = {"get_s": dt, **tel.step_metrics()}
    return out


def driver(path: Path) -> None:
    ray.init(address=os.environ["RAYLOC_ADDRESS"], log_to_driver=False,
             runtime_env={"env_vars": forwarded()})
    try:
        out = scenarios()
    finally:
        ray.shutdown()
    path.write_text(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "--cluster":
        cluster(Path(sys.argv[2]))
    else:
        driver(Path(sys.argv[1]))
