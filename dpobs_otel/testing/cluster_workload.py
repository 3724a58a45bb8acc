"""One training process of a simulated node (tests/agent/test_multinode.py, and the
Prometheus source test in tests/readback/): dpobs.start() into the node's file_sd directory,
an instrumented in-memory data plane with a fixed service time, and a known op mix per step,
until a stop file appears. It keeps its own truth (steps, step seconds, and per op: calls,
seconds, payload bytes, all measured here, not by dpobs) and a timeline of (wall time, steps
done), writes them to --truth, then serves its endpoint until SIGTERM.

    python -m dpobs_otel.testing.cluster_workload --role rollout --rank 0 --port 9310 \
        --sd-dir D --truth T --stop-file S ...
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time

import torch

import dpobs_otel as dpobs

JOB = "dpobs-mn"


def nbytes(td) -> int:
    """Payload bytes of a TensorDict's tensors, counted here from numel * element size."""
    return sum(t.numel() * t.element_size() for t in td.values())


class Truth:
    def __init__(self, endpoint: str):
        self.doc = {"endpoint": endpoint, "pid": os.getpid(), "steps": 0, "step_s": 0.0,
                    "ops": {}, "timeline": [], "done": False}

    def call(self, op: str, fn, *args, write: int = 0, **kw):
        from tensordict import TensorDict  # see train()
        t0 = time.perf_counter()
        out = fn(*args, **kw)
        d = self.doc["ops"].setdefault(op, {"calls": 0, "seconds": 0.0, "write": 0, "read": 0})
        d["seconds"] += time.perf_counter() - t0
        d["calls"] += 1
        d["write"] += write
        if isinstance(out, TensorDict):
            d["read"] += nbytes(out)
        return out

    def write(self, path: str) -> None:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f)
        os.replace(tmp, path)


def train(args, tel, truth: Truth) -> None:
    # tensordict sets TORCHINDUCTOR_CACHE_DIR when imported: imported here, so importing
    # this module changes nothing
    from tensordict import TensorDict
    client = tel.instrument(dpobs.InMemoryDataPlane(latency_s=args.latency_s))
    batch = TensorDict({"obs": torch.ones(args.rows, args.width),
                        "act": torch.zeros(args.rows, dtype=torch.int64)}, batch_size=[args.rows])
    truth.call("register", client.register_partition, "p")
    step = 0
    while not os.path.exists(args.stop_file):
        ids = [f"{step}-{i}" for i in range(args.rows)]
        with tel.step():
            t0 = time.perf_counter()
            truth.call("put", client.put_samples, ids, "p", batch, write=nbytes(batch))
            truth.call("get", client.get_samples, ids, "p")
            truth.call("get", client.get_samples, ids, "p", select_fields=["obs"])
            truth.call("list", client.list_sample_ids, "p")
            truth.call("clear", client.clear_samples, ids, "p")
            time.sleep(args.compute_s)  # the step's own work, outside the data plane
            truth.doc["step_s"] += time.perf_counter() - t0
        step += 1
        truth.doc["steps"] = step
        truth.doc["timeline"].append((time.time(), step))


def main() -> None:
    p = argparse.ArgumentParser()
    for name in ("--role", "--sd-dir", "--truth", "--stop-file"):
        p.add_argument(name, required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--latency-s", type=float, default=0.01)
    p.add_argument("--compute-s", type=float, default=0.05)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--width", type=int, default=64)
    args = p.parse_args()
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    tel = dpobs.start(role=args.role, rank=args.rank, job=JOB, port=args.port,
                      sd_dir=args.sd_dir)
    truth = Truth(tel.endpoint)
    train(args, tel, truth)
    truth.doc["done"], truth.doc["finished"] = True, time.time()
    truth.write(args.truth)
    stopped.wait()  # keep serving the final values until the test is done with them
    tel.shutdown()


if __name__ == "__main__":
    main()
