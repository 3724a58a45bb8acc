"""Series per endpoint, per client kind, inside the budget docs/development/scaling.md states
("Series per endpoint"): each kind's process runs the stated mix of ops and its /metrics is
counted as a scrape counts it (scrape_samples_scraped: every sample, target_info and each
histogram bucket included). A change that grows a kind past its budget fails here, and the
budget and the capacity figures that rest on it are to be redone together."""
from __future__ import annotations

import pytest
import torch
from helpers import scrape
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel import names
from dpobs_otel.adapters.ray.meter import RayMeter

# kind -> samples per scrape at most (docs/development/scaling.md, "Series per endpoint")
# (measured: 155, 196, 532, 448, 45, 49 with Ray's data time and locality; the budget leaves
# about 5%)
BUDGET = {"data-plane client": 165, "data-plane client, row age": 205, "Ray driver": 560,
          "Ray worker": 470, "weight sender": 48, "weight receiver": 52}
STEPS, ROWS = 3, 4
METHODS = 8  # the Ray kinds' distinct methods, a GRPO job's actor methods and more


def _data_plane(tel) -> None:
    """Every op of the store once a step, and a failing get (one exception class)."""
    store = dpobs.InMemoryDataPlane()
    client = tel.instrument(store)
    client.register_partition("p")
    for step in range(STEPS):
        with tel.step():
            ids = [f"s{step}-{i}" for i in range(ROWS)]
            client.put_samples(ids, "p", TensorDict({"x": torch.ones(ROWS, 8)}, [ROWS]))
            client.get_samples(ids, "p")
            client.get_data(ids, "p")
            client.list_sample_ids("p")
            client.clear_samples(ids, "p")
            with pytest.raises(Exception):
                client.get_samples(ids, "p")


def _ray_driver(tel) -> None:
    meter = RayMeter(tel)
    for step in range(STEPS):
        with tel.step():
            meter.record(names.RAY_PUT, None, 0.001, 1, 1000, 0.0001)
            meter.record(names.RAY_WAIT, None, 0.001, 1)
            for m in range(METHODS):
                meter.record(names.RAY_CALL, f"Worker.m{m}", 0.001, 1, 100, 0.0001)
                meter.record(names.RAY_GET, f"Worker.m{m}", 0.01, 1, 1000, 0.0001)
    meter.record(names.RAY_GET, "Worker.m0", 0.01, 1, 0, error="RayTaskError(ValueError)")


def _ray_worker(tel) -> None:
    meter = RayMeter(tel)
    for _ in range(STEPS):
        for m in range(METHODS):
            meter.record(names.RAY_ARGS, f"Worker.m{m}", 0.001, 1, 100, 0.0001)
            meter.record(names.RAY_RETURN, f"Worker.m{m}", 0.001, 1, 1000, 0.0001)


def _weights(side: str):
    def run(tel) -> None:
        for version in range(STEPS):
            with tel.step(), tel.weights.sync(version, side):
                pass
    return run


KINDS = {"data-plane client": ({}, _data_plane),
         "data-plane client, row age": ({"row_age": True}, _data_plane),
         "Ray driver": ({}, _ray_driver), "Ray worker": ({}, _ray_worker),
         "weight sender": ({}, _weights("send")), "weight receiver": ({}, _weights("receive"))}


def series(kind: str) -> int:
    settings, run = KINDS[kind]
    tel = dpobs.start(role="budget", rank=0, port=0, **settings)
    try:
        run(tel)
        return len(scrape(tel))
    finally:
        tel.shutdown()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_series_per_endpoint_stay_inside_the_budget(kind):
    assert series(kind) <= BUDGET[kind], (kind, BUDGET[kind])
