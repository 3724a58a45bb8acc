"""VerlInstrumentor in one process: verl's own `naive` backend and engines written on verl's
base class with verl's chunking helpers (helpers.verl_engines). Every kind of method verl's
backends have is measured and keeps its kind; the fingerprints' manifest survives being cut
into chunks and merged back; an override calling super() counts once; a backend defined
after instrument() is measured and uninstrument() leaves every class verl's own; a stream of
something other than (name, tensor) pairs is left alone; verl syncing with no step keeps the
version. (Faults and the off switch: test_verl_harmless.py; processes: test_verl_gloo.py.)"""
from __future__ import annotations

import inspect

import pytest
from helpers import scrape, value

pytest.importorskip("verl.checkpoint_engine")

from helpers import verl_engines as ve  # noqa: E402
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry  # noqa: E402

from dpobs_otel import names  # noqa: E402
from dpobs_otel.adapters.instrumentation import MEASURED  # noqa: E402
from dpobs_otel.adapters.verl.engines import subclasses  # noqa: E402
from dpobs_otel.weights import MANIFEST_NAME  # noqa: E402

BUCKET = 64  # bytes: every weight but layers.0.bias, and the manifest, take several chunks


def _side(samples, side: str) -> tuple:
    return (value(samples, names.WEIGHTS_SYNC_DURATION_SERIES + "_count", side=side),
            value(samples, names.WEIGHTS_TRANSFERRED_SERIES, side=side),
            value(samples, names.WEIGHTS_TENSORS_SERIES, side=side),
            value(samples, names.WEIGHTS_VERSION_SERIES, side=side))


def _checked(samples) -> dict:
    out = {r: value(samples, names.WEIGHTS_MISMATCHED_SERIES, reason=r)
           for r in names.WEIGHT_MISMATCH_REASONS}
    out["checked"] = value(samples, names.WEIGHTS_CHECKED_SERIES)
    return out


CLEAN = {"value": 0, "missing": 0, "unexpected": 0}


def test_the_naive_backend_is_measured_and_hands_on_the_very_items(proving, instrumented):
    w = ve.weights(1)
    items = list(w.items())
    engine = CheckpointEngineRegistry.new("naive", bucket_size=BUCKET)
    engine.send_weights(iter(items), global_steps=5)
    got = list(engine.receive_weights(global_steps=5))
    assert len(got) == len(items) and all(a is b for a, b in zip(got, items))
    s = scrape(proving)
    for side in names.WEIGHT_SIDES:
        assert _side(s, side) == (1, ve.payload(w.values()), len(w), 5)
    assert _checked(s) == {**CLEAN, "checked": len(w)}


@pytest.mark.parametrize("kind", ve.KINDS, ids=lambda k: k.__name__)
def test_every_kind_of_method_keeps_its_kind_and_its_manifest_survives_chunking(
        proving, instrumented, kind):
    engine = kind(bucket_size=BUCKET)
    for name in ("send_weights", "receive_weights"):
        mine, own = getattr(kind, name), getattr(kind, name).__wrapped__
        assert getattr(mine, MEASURED)
        for test in (inspect.iscoroutinefunction, inspect.isasyncgenfunction,
                     inspect.isgeneratorfunction):
            assert test(mine) == test(own), (name, test.__name__)
    w = ve.weights(2)
    ve.push(engine, w, version=2)
    manifest_chunks = [m for m, _ in engine.chunks if m.name == MANIFEST_NAME]
    assert len(manifest_chunks) > 1  # cut by verl's split_weight_chunks, merged back below
    got = ve.pull(engine, version=2)
    assert [n for n, _ in got] == list(w)  # the manifest taken out before the consumer
    s = scrape(proving)
    for side in names.WEIGHT_SIDES:
        assert _side(s, side) == (1, ve.payload(w.values()), len(w), 2)
    assert _checked(s) == {**CLEAN, "checked": len(w)}


def test_a_chunk_changed_on_the_wire_is_caught(proving, instrumented):
    engine = ve.Loopback(bucket_size=BUCKET)
    ve.push(engine, ve.weights(3), version=3)

    def flip(meta, chunk):  # one bit of the second chunk of embed.weight
        if meta.name == "embed.weight" and meta.chunk_offset == BUCKET:
            chunk = chunk.clone()
            chunk[10] ^= 1
        return meta, chunk
    engine.tamper(flip)
    ve.pull(engine, version=3)
    assert _checked(scrape(proving)) == {**CLEAN, "value": 1, "checked": 4}


def test_an_override_that_calls_super_is_measured_once(proving, instrumented):
    engine = ve.Chained(bucket_size=BUCKET)
    w = ve.weights(4)
    ve.push(engine, w, version=4)
    assert len(ve.pull(engine, version=4)) == len(w)
    s = scrape(proving)
    for side in names.WEIGHT_SIDES:
        assert _side(s, side) == (1, ve.payload(w.values()), len(w), 4)


def test_a_sync_with_no_step_keeps_the_last_version(proving, instrumented):
    engine = ve.Loopback(bucket_size=BUCKET)
    for version in (7, None):
        ve.push(engine, ve.weights(7), version=version)
        ve.pull(engine, version=version)
        engine.finalize()
    s = scrape(proving)
    for side in names.WEIGHT_SIDES:
        assert _side(s, side)[0] == 2 and _side(s, side)[3] == 7
    assert _checked(s) == {**CLEAN, "checked": 8}


def test_what_is_not_a_named_tensor_stream_is_left_alone(proving, instrumented):
    engine = ve.Patches(bucket_size=BUCKET)
    ve.push(engine, ve.weights(1), version=1)
    [(named, last)] = ve.pull(engine, version=1)
    assert named[0][0] == "__values__" and last is True
    assert value(scrape(proving), names.WEIGHTS_SYNC_DURATION_SERIES + "_count",
                 side="send") is None


def test_a_backend_defined_later_is_measured_and_uninstrument_leaves_verl_its_own(proving):
    from dpobs_otel.adapters.verl import VerlInstrumentor

    own = {(c, m): c.__dict__[m] for c in subclasses(CheckpointEngine)
           for m in ("send_weights", "receive_weights") if m in c.__dict__}
    inst = VerlInstrumentor()
    inst.instrument(telemetry=proving)
    try:
        @CheckpointEngineRegistry.register("dpobs-test-later")
        class Later(ve.Loopback):
            async def send_weights(self, weights, global_steps=None):
                await super().send_weights(weights, global_steps)

        engine = CheckpointEngineRegistry.new("dpobs-test-later", bucket_size=BUCKET)
        ve.push(engine, ve.weights(1), version=1)
        assert len(ve.pull(engine, version=1)) == 4
        assert _side(scrape(proving), "send")[0] == 1
    finally:
        inst.uninstrument()
        CheckpointEngineRegistry._registry.pop("dpobs-test-later", None)
    assert "__init_subclass__" not in CheckpointEngine.__dict__
    for (cls, name), fn in own.items():
        assert cls.__dict__[name] is fn, (cls, name)
    assert not hasattr(Later.__dict__["send_weights"], MEASURED)

    class AfterwardsToo(ve.Loopback):
        async def send_weights(self, weights, global_steps=None):
            pass
    assert not hasattr(AfterwardsToo.__dict__["send_weights"], MEASURED)
