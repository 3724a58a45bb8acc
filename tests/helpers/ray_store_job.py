"""A verl-shaped Ray driver on a small object store, run step after step until its stdin closes,
in one of three modes (RAYSTORE_MODE):

    fit    each step's batch is put, dispatched by reference to a worker actor and its result
           collected; the driver holds the last FIT_HELD batches (well inside the store)
    spill  the same, holding up to SPILL_HELD batches (more than twice the store): Ray spills;
           and one call of a method that raises, first
    full   spilling off and the node's disk counted full (local_fs_capacity_threshold 0), so
           Ray has nowhere to put what its store cannot hold: one put larger than the store
           is refused (the class Ray raises is the truth), then the fit loop runs
    pinned spilling off, batches of a quarter the size held up to PINNED_HELD (half as much
           again as the store): its shared memory fills and the rest is allocated on disk
           (Ray's fallback), no put refused

The driver runs dpobs in code (dpobs.start + the Ray adapter, steps around each step); its
workers measure their side zero-code (DPOBS_AUTO through runtime_env). It prints JSON lines:
{"ready": ...} once its first step is done and its node is announced in DPOBS_SD_DIR (with
the errors of the refused put so far), and
{"truth": ...} when it stops (stdin closed), before Ray goes down: steps, puts, calls, the
refused puts' errors by class, the class the raising method's get raised.

    RAYSTORE_MODE=spill DPOBS_SD_DIR=DIR DPOBS_JOB=JOB python -m helpers.ray_store_job

Run by tests/adapters/ray/test_ray_store_alerts.py.
"""
from __future__ import annotations

import glob
import json
import os
import sys
import threading
import time

import numpy as np
import ray

import dpobs_otel as dpobs
from dpobs_otel.adapters.ray import instrument
from helpers.ray_runs import forwarded

STORE = 100 * 1024**2  # object_store_memory (Ray's minimum is 75 MiB)
BATCH = 10 * 1024**2  # bytes of each step's batch
FIT_HELD, SPILL_HELD, PINNED_HELD = 3, 24, 60
STEP_PAUSE_S = 0.05  # the rest of a step (the machine is shared)
REPORT_MS = 200  # Ray's metrics_report_interval_ms (its default is 10 s)


@ray.remote
class Scorer:
    def score(self, batch):
        return float(batch[:1024].sum())

    def boom(self):
        raise ValueError("a method that raises")


def _config(mode: str) -> dict:
    cfg = {"metrics_report_interval_ms": REPORT_MS}
    if mode in ("full", "pinned"):
        cfg.update(automatic_object_spilling_enabled=False)
    if mode == "full":
        cfg.update(local_fs_capacity_threshold=0.0)
    return cfg


def emit(**event) -> None:
    print(json.dumps(event), flush=True)


def _refused(truth: dict) -> None:
    """One put larger than the whole store: refused where Ray can neither spill nor fall back
    on disk. The class the program saw, counted as dpobs should count it."""
    try:
        ray.put(np.ones(int(STORE * 1.2) // 8))
    except Exception as exc:
        truth["errors"][type(exc).__name__] = truth["errors"].get(type(exc).__name__, 0) + 1


def run(mode: str, stop: threading.Event) -> dict:
    tel = dpobs.start(role="driver", job=os.environ["DPOBS_JOB"],
                      sd_dir=os.environ["DPOBS_SD_DIR"], host="127.0.0.1")
    instrument(tel)
    truth = {"steps": 0, "puts": 0, "calls": 0, "errors": {}, "raised": None}
    truth["capacity"] = int(ray.cluster_resources()["object_store_memory"])
    truth["node"] = ray.nodes()[0]["NodeManagerAddress"]
    truth["instance"] = tel.endpoint
    scorer = Scorer.remote()
    if mode == "full":
        _refused(truth)
    if mode == "spill":  # one method that raises: a Ray op's error, by method and class
        try:
            ray.get(scorer.boom.remote())
        except Exception as exc:
            truth["raised"] = type(exc).__name__
    held, limit = [], {"spill": SPILL_HELD, "pinned": PINNED_HELD}.get(mode, FIT_HELD)
    size = BATCH // 4 if mode == "pinned" else BATCH
    rng = np.random.default_rng(0)
    while not stop.is_set():
        with tel.step():
            ref = ray.put(rng.standard_normal(size // 8))
            ray.get(scorer.score.remote(ref))
        truth["steps"] += 1
        truth["puts"] += 1
        truth["calls"] += 1
        held = (held + [ref])[-limit:]
        del ref
        if truth["steps"] == 1:
            emit(ready=_announced(truth))
        time.sleep(STEP_PAUSE_S)
    return truth


def _announced(truth: dict) -> dict:
    sd = os.environ["DPOBS_SD_DIR"]
    deadline = time.monotonic() + 30
    while not glob.glob(os.path.join(sd, "ray-node-*.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"node": truth["node"], "instance": truth["instance"], "capacity": truth["capacity"],
            "errors": dict(truth["errors"]), "announced": sorted(os.path.basename(p)
                                for p in glob.glob(os.path.join(sd, "ray-node-*.json")))}


def main() -> None:
    mode = os.environ["RAYSTORE_MODE"]
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    env = forwarded()
    env.update(DPOBS_AUTO="1")
    ray.init(_node_ip_address="127.0.0.1", address="local", include_dashboard=False,
             num_cpus=1, object_store_memory=STORE, log_to_driver=False,
             runtime_env={"env_vars": env}, _system_config=_config(mode))
    try:
        emit(truth=run(mode, stop))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
