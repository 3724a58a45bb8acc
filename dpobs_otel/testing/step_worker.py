"""One process of tests/readback/test_cluster.py's cluster (python -m
dpobs_otel.testing.step_worker): dpobs.start() into a file_sd directory, an
instrumented in-memory data plane, and steps on command. Its truth is its own
tel.step_metrics() after every step, summed: the per-step deltas the driver's cluster dict
must add up to.

stdin, one command a line; stdout, one JSON line per command:
    steps N [corrupt]   N steps (a row rewritten behind the guard's back in the first one
                        when `corrupt`), then {"sum": the summed per-step dicts since the
                        last report, "last": the last one}
    exit                shut down cleanly (the file_sd file goes) and exit
Started, it prints {"endpoint": "host:port", "pid": pid}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

import dpobs_otel as dpobs


def step(tel, client, raw, n: int, rows: int, corrupt: bool) -> None:
    # tensordict sets TORCHINDUCTOR_CACHE_DIR when imported: imported here, so importing
    # this module changes nothing
    from tensordict import TensorDict
    ids = [f"{n}-{i}" for i in range(rows)]
    batch = TensorDict({"obs": torch.arange(rows * 16, dtype=torch.float32).reshape(rows, 16),
                        "act": torch.ones(rows, dtype=torch.int64)}, batch_size=[rows])
    with tel.step():
        with tel.codec("pack"):
            batch = batch.clone()
        client.put_samples(ids, "p", batch)
        if corrupt:  # an uninstrumented writer rewrites one row between the put and the get
            raw.put_samples(ids[:1], "p", TensorDict({"obs": batch["obs"][:1] + 1},
                                                      batch_size=[1]))
        client.get_samples(ids, "p")
        client.get_samples(ids, "p", select_fields=["obs"])
        try:
            client.get_samples(["absent"], "p")  # an error, counted per op
        except KeyError:
            pass
        client.list_sample_ids("p")
        client.clear_samples(ids[: rows // 2], "p")  # half stay outstanding


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--role", required=True)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--sd-dir", required=True)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--guard", action="store_true")
    args = p.parse_args()
    tel = dpobs.start(role=args.role, rank=args.rank, job="dpobs-cl", port=args.port,
                      sd_dir=args.sd_dir, verify_tensor_hash=args.guard)
    raw = dpobs.InMemoryDataPlane()
    client = tel.instrument(raw)
    print(json.dumps({"endpoint": tel.endpoint, "pid": os.getpid()}), flush=True)
    total: dict[str, float] = {}
    last: dict[str, float] = {}
    done = 0
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "exit":
            break
        for i in range(int(cmd[1])):
            step(tel, client, raw, done, args.rows, i == 0 and "corrupt" in cmd)
            done += 1
            last = tel.step_metrics()
            for k, v in last.items():
                total[k] = total.get(k, 0.0) + v
        print(json.dumps({"sum": total, "last": last}), flush=True)
        total = {}
    tel.shutdown()


if __name__ == "__main__":
    main()
