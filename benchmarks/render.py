"""/metrics render time in both expositions (issue 22: at most 10 ms each).

One process with every op observed many times over a spread of latencies (each op's native
histogram then holds ~100 buckets), the guard on (its per-field series), then the /metrics
route's handler called directly with Prometheus's own Accept and Accept-Encoding headers,
the text and the protobuf exposition interleaved round by round. Prints medians and p90s in
ms and the body sizes.

    .venv/bin/python benchmarks/render.py [--rounds 200]
"""
from __future__ import annotations

import argparse
import math
import random
import statistics
import time

from tensordict import TensorDict
import torch

import dpobs_otel as dpobs

TEXT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"  # Prometheus without native histograms
PROTO = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
         "encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3,*/*;q=0.2")


def populate(tel) -> None:
    client = tel.instrument(dpobs.InMemoryDataPlane())
    td = TensorDict({"x": torch.ones(4, 8), "y": torch.zeros(4, 2)}, batch_size=[4])
    with tel.step():
        client.put_samples(list("abcd"), "p", td)
        client.get_samples(list("abcd"), "p")
        client.list_sample_ids("p")
        client.clear_samples(list("abcd"), "p")
    rng = random.Random(0)
    for op in ("put", "get", "list", "clear"):  # two decades of latency per op
        for _ in range(20_000):
            tel.op_duration.record(math.exp(rng.uniform(math.log(1e-4), math.log(1e-2))),
                                   tel.op_attrs[op])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    tel = dpobs.start(role="render", port=0, verify_tensor_hash=True)
    try:
        populate(tel)
        handler = tel.exporters[0]._metrics
        times = {"text": [], "protobuf": []}
        sizes = {}
        for r in range(args.rounds):
            order = (("text", TEXT), ("protobuf", PROTO))
            for name, accept in (order if r % 2 else order[::-1]):
                environ = {"REQUEST_METHOD": "GET", "HTTP_ACCEPT": accept,
                           "HTTP_ACCEPT_ENCODING": "gzip", "QUERY_STRING": ""}
                t0 = time.perf_counter()
                status, _, body = handler(environ)
                times[name].append(time.perf_counter() - t0)
                sizes[name] = len(body)
                assert status == "200 OK"
        for name, ts in times.items():
            ts = sorted(ts)
            print(f"{name:<9} median {1e3 * statistics.median(ts):6.2f} ms   "
                  f"p90 {1e3 * ts[int(0.9 * len(ts))]:6.2f} ms   {sizes[name]} bytes gzipped")
    finally:
        tel.shutdown()


if __name__ == "__main__":
    main()
