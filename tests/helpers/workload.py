"""One small workload that makes a process export every series dpobs has: each op, a step, a
codec block, a weight sync (both sides), a failing op, a read of rows written without the guard, a guard that raises, and
a store that hands back something other than a TensorDict."""
from __future__ import annotations

import contextlib
import urllib.request

import torch
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel import names
from dpobs_otel.guard import hooks


class _Odd(dpobs.InMemoryDataPlane):
    """A store whose list answers with a generator: sized as nothing, counted as the client's
    instrumentation error, handed back untouched."""

    def list_sample_ids(self, partition_id):
        return iter(super().list_sample_ids(partition_id))


def _raising(*_a, **_k):
    raise RuntimeError("planted guard failure")


def exercise(tel) -> None:
    store = _Odd()
    client = tel.instrument(store)
    ids = [f"s{i}" for i in range(4)]
    td = TensorDict({"x": torch.arange(32).reshape(4, 8),
                     "c": torch.zeros(4, 2, dtype=torch.complex64)}, batch_size=[4])
    td["meta"] = "text"
    with tel.step():
        with tel.codec("pack"):
            pass
        client.put_samples(ids, "p0", td)
        client.get_samples(ids, "p0", ["x", "c"])
        client.list_sample_ids("p0")
        store.put_samples(["raw"], "p0", td[:1])  # written around dpobs: unverified on read
        client.get_samples(["raw"], "p0", ["x"])
        client.clear_samples(ids, "p0")
        # One process, no store (no Ray, no process group): the proof rides in the stream,
        # so the receiving side checks the tensor.
        tel.weights.in_band = True
        pushed = list(tel.weights.sent(iter({"w": torch.ones(2, 2)}.items()), version=1))
    list(tel.weights.received(iter(pushed), version=1))  # both sides of one weight sync
    with contextlib.suppress(KeyError):
        client.get_samples(["absent"], "no-such-partition", ["x"])
    _ray_ops(tel)
    original = hooks.field_digests
    hooks.field_digests = _raising
    try:
        client.put_samples(["g"], "p1", td[:1])
    finally:
        hooks.field_digests = original


def _ray_ops(tel) -> None:
    """What the Ray adapter records for a put and a get of an object made on another node
    (its account, without a Ray cluster: the NodeIDs are the ones Ray would name)."""
    from dpobs_otel.adapters.ray.meter import RayMeter
    meter = RayMeter(tel)
    meter.where.node = "a" * 56
    meter.record(names.RAY_PUT, None, 0.002, 1, 4096, 0.0005, owned=bytes.fromhex("00aa"))
    meter.record(names.RAY_GET, None, 0.01, 1, 4096, 0.0005, data=0.002,
                 moved=((names.RAY_REMOTE_LOCALITY, 4096, "b" * 56),))


@contextlib.contextmanager
def exercised_process(role: str):
    """A Telemetry with the guard on that has run exercise(), shut down on exit."""
    tel = dpobs.start(role=role, rank=0, port=0, verify_tensor_hash=True)
    try:
        exercise(tel)
        yield tel
    finally:
        tel.shutdown()


def series_names(tel, native: bool = True) -> set[str]:
    """The sample names of tel's text exposition, and (native) the native histograms that
    only its protobuf exposition has."""
    text = urllib.request.urlopen(f"http://{tel.endpoint}/metrics", timeout=10).read().decode()
    out = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
           if line and not line.startswith("#")}
    if native:
        from helpers.protodecode import decode
        out |= {f.name for f in decode(tel.exporters[0].render_protobuf())
                if any(m.histogram.zero_threshold > 0 for m in f.metric)}
    return out
