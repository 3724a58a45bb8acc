"""The micro-costs behind the hot path's shortcuts, each beside the public path it avoids.

    .venv/bin/python benchmarks/micro.py

Prints microseconds per call (best of 5 timeit repeats); docs/development/performance.md keeps the figures.
"""
from __future__ import annotations

import timeit
import urllib.request

import torch
from prometheus_client.parser import text_string_to_metric_families
from tensordict import NonTensorData, TensorDict

import dpobs_otel as dpobs
from dpobs_otel.shims import torch_jagged
from dpobs_otel.readback.scrape import parse
from dpobs_otel.sizing import _offsets_span


def best_us(fn, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def metrics_body() -> str:
    """A /metrics body after one put, get, list and clear with the guard on."""
    tel = dpobs.start(role="micro", rank=0, port=0, verify_tensor_hash=True)
    try:
        client = tel.instrument(dpobs.InMemoryDataPlane())
        ids = [f"s{i}" for i in range(4)]
        with tel.step():
            client.put_samples(ids, "p", TensorDict({"x": torch.zeros(4, 8)}, batch_size=[4]))
            client.get_samples(ids, "p")
            client.list_sample_ids("p")
            client.clear_samples(ids, "p")
        return urllib.request.urlopen(f"http://{tel.endpoint}/metrics").read().decode()
    finally:
        tel.shutdown()


def main() -> None:
    nt = torch.nested.nested_tensor([torch.zeros(n, dtype=torch.int64) for n in range(1, 257)],
                                    layout=torch.jagged)
    off = torch_jagged.offsets(nt)
    row = NonTensorData("abc")
    body = metrics_body()
    pairs = [
        ("jagged size", lambda: nt.numel(), lambda: torch_jagged.values(nt).nbytes, 20000),
        ("offsets span", lambda: int(off[-1]) - int(off[0]), lambda: _offsets_span(off), 100000),
        ("non-tensor value", lambda: row.data, lambda: row._non_tensordict["data"], 100000),
        (f"parse /metrics ({len(body.splitlines())} lines)",
         lambda: [s for f in text_string_to_metric_families(body) for s in f.samples],
         lambda: parse(body), 200),
    ]
    print(f"{'what':<32}{'public us':>12}{'dpobs us':>12}")
    for what, public, ours, number in pairs:
        print(f"{what:<32}{best_us(public, number):>12.2f}{best_us(ours, number):>12.2f}")


if __name__ == "__main__":
    main()
