"""The kinds of process in a Ray job and one step of each, as docs/development/scaling.md
("Series per endpoint") states them: what tests/test_series_budget.py holds to a budget and
benchmarks/scale.py runs at 1024 endpoints, defined here once so the two cannot drift apart.
A step runs every op its kind makes (and one failing op, one exception class) through the
real instruments: the store client of an InMemoryDataPlane, or the RayMeter the Ray adapter
records through (no live Ray). torch and tensordict are imported when a data-plane step runs.
"""
from __future__ import annotations

from .. import names

METHODS = 8  # the Ray kinds' distinct actor methods: a GRPO job's, and more
ROWS = 8
# kind -> dpobs.start settings
SETTINGS = {"data-plane client": {}, "data-plane client, row age": {"row_age": True},
            "Ray driver": {}, "Ray worker": {}, "weight sender": {}, "weight receiver": {}}
# The scale benchmark's mix, every 16 endpoints: one Ray driver, eight Ray workers, three
# data-plane clients and one with row age, one weight sender (the trainer) and two
# receivers. (kind, role)
MIX = ([("Ray driver", "driver")] + [("Ray worker", "worker")] * 8
       + [("data-plane client", "rollout")] * 3 + [("data-plane client, row age", "rollout")]
       + [("weight sender", "trainer")] + [("weight receiver", "rollout")] * 2)


def context(tel, kind: str):
    """What a kind's step needs: its store client, its Ray meter, or nothing."""
    if kind.startswith("data-plane"):
        import dpobs_otel as dpobs
        client = tel.instrument(dpobs.InMemoryDataPlane())
        client.register_partition("p")
        return client
    if kind.startswith("Ray"):
        from ..adapters.ray.meter import RayMeter
        return RayMeter(tel)
    return None


def _data_plane(tel, client, step: int) -> None:
    import torch
    from tensordict import TensorDict
    ids = [f"{step}-{i}" for i in range(ROWS)]
    with tel.step():
        client.put_samples(ids, "p", TensorDict({"obs": torch.ones(ROWS, 64)}, [ROWS]))
        client.get_samples(ids, "p")
        client.get_data(ids, "p")
        client.list_sample_ids("p")
        client.clear_samples(ids, "p")
        try:
            client.get_samples(ids, "p")
        except Exception:  # noqa: BLE001 - cleared rows: the failing get of the mix
            pass


def _ray_driver(tel, meter, step: int) -> None:
    with tel.step():
        meter.record(names.RAY_PUT, None, 0.001, 1, 1000, 0.0001)
        meter.record(names.RAY_WAIT, None, 0.001, 1)
        for m in range(METHODS):
            meter.record(names.RAY_CALL, f"Worker.m{m}", 0.001, 1, 100, 0.0001)
            meter.record(names.RAY_GET, f"Worker.m{m}", 0.01, 1, 1000, 0.0001)
    if step == 0:
        meter.record(names.RAY_GET, "Worker.m0", 0.01, 1, 0, error="RayTaskError(ValueError)")


def _ray_worker(tel, meter, step: int) -> None:
    for m in range(METHODS):  # workers have no steps
        meter.record(names.RAY_ARGS, f"Worker.m{m}", 0.001, 1, 100, 0.0001)
        meter.record(names.RAY_RETURN, f"Worker.m{m}", 0.001, 1, 1000, 0.0001)


def _weights(side: str):
    def step_once(tel, _, step: int) -> None:
        with tel.step(), tel.weights.sync(step, side):
            pass
    return step_once


# kind -> step(tel, context, step number)
STEP = {"data-plane client": _data_plane, "data-plane client, row age": _data_plane,
        "Ray driver": _ray_driver, "Ray worker": _ray_worker,
        "weight sender": _weights("send"), "weight receiver": _weights("receive")}
