"""The verl adapter is harmless (the rules of tests/test_faults.py and tests/test_facade.py):
a fault of dpobs's own on a call's way leaves the call to verl, with verl's own objects, and
is one dpobs_instrumentation_errors_total{component="adapter"} increment (logged once); the
off switch patches nothing of verl; a disabled Telemetry hands every call to verl untouched."""
from __future__ import annotations

import asyncio
import logging

import pytest
import torch
from helpers import scrape, value

pytest.importorskip("verl.checkpoint_engine")

from helpers import verl_engines as ve  # noqa: E402
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry  # noqa: E402

from dpobs_otel import names, telemetry  # noqa: E402
from dpobs_otel.adapters.verl import VerlInstrumentor  # noqa: E402
from dpobs_otel.adapters.verl import syncs  # noqa: E402
from dpobs_otel.adapters.verl.engines import METHODS, subclasses  # noqa: E402
from dpobs_otel.telemetry import DisabledTelemetry  # noqa: E402

COUNT = names.WEIGHTS_SYNC_DURATION_SERIES + "_count"


class Injected(Exception):
    """dpobs's own failure, made on purpose."""


def _raise(*args, **kwargs):
    raise Injected("injected")


# fault -> (where it goes, the sides it leaves unmeasured)
FAULTS = {"send stream": (lambda tel: (syncs, "Sync"), ("send",)),
          "receive stream": (lambda tel: (tel.weights, "received"), ("receive",)),
          "version": (lambda tel: (syncs.VerlWeights, "_version"), ("send", "receive"))}


def _sync(engine, version: int) -> list:
    w = ve.weights(version)
    given = iter(w.items())
    result = engine.send_weights(given, global_steps=version)
    asyncio.run(result)
    got = ve.pull(engine, version=version)
    assert [n for n, _ in got] == list(w)
    assert all(torch.equal(t, w[n]) for n, t in got)
    engine.finalize()
    return given


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_leaves_the_call_to_verl_and_is_counted(proving, instrumented, monkeypatch,
                                                        caplog, fault):
    where, broken = FAULTS[fault]
    monkeypatch.setattr(telemetry, "_LOGGED", set())
    caplog.set_level(logging.WARNING, logger="dpobs_otel")
    engine = ve.Loopback(bucket_size=64)
    monkeypatch.setattr(*where(proving), _raise)
    for i in (1, 2):
        given = _sync(engine, i)
        if "send" in broken:
            assert engine.given is given  # verl's engine got the caller's own object
        s = scrape(proving)
        assert value(s, names.INSTR_ERRORS_SERIES, component=names.COMPONENT_ADAPTER) == \
            i * len(broken)
        for side in names.WEIGHT_SIDES:
            assert value(s, COUNT, side=side) == (None if side in broken else i)
    assert sum("internal error in adapter" in r.getMessage() for r in caplog.records) == 1
    monkeypatch.undo()
    _sync(engine, 3)  # the fault gone: measured as usual, nothing more counted
    s = scrape(proving)
    assert value(s, names.INSTR_ERRORS_SERIES, component=names.COMPONENT_ADAPTER) == \
        2 * len(broken)
    for side in names.WEIGHT_SIDES:
        assert value(s, COUNT, side=side) == (1 if side in broken else 3)


def _own_methods() -> dict:
    return {(c, m): c.__dict__[m] for c in subclasses(CheckpointEngine) for m in METHODS
            if m in c.__dict__}


@pytest.mark.parametrize("switch", ["DPOBS_DISABLED", "OTEL_SDK_DISABLED"])
def test_the_off_switch_patches_nothing_of_verl(monkeypatch, switch):
    own = _own_methods()
    monkeypatch.setenv(switch, "true")
    inst = VerlInstrumentor()
    try:
        assert inst.instrument() is None
        assert _own_methods() == own
        assert "__init_subclass__" not in CheckpointEngine.__dict__
    finally:
        inst.uninstrument()


def test_a_disabled_telemetry_hands_every_call_to_verl_untouched():
    inst = VerlInstrumentor()
    inst.instrument(telemetry=DisabledTelemetry())
    try:
        engine = ve.Loopback(bucket_size=64)
        given = _sync(engine, 1)
        assert engine.given is given
        naive = CheckpointEngineRegistry.new("naive", bucket_size=64)
        items = list(ve.weights(1).items())
        stream = iter(items)
        naive.send_weights(stream, global_steps=1)
        assert naive.weights is stream
        assert all(a is b for a, b in zip(naive.receive_weights(global_steps=1), items))
    finally:
        inst.uninstrument()


def test_a_failure_to_patch_a_class_never_fails_its_definition(proving, instrumented,
                                                               monkeypatch, caplog):
    with monkeypatch.context() as m:
        m.setattr(instrumented._patches, "_measure", _raise)

        class Defined(ve.Loopback):  # a user's backend, defined while dpobs cannot wrap it
            async def send_weights(self, weights, global_steps=None):
                self.given = weights

    assert Defined.send_weights.__name__ == "send_weights"
    assert not hasattr(Defined.send_weights, "__wrapped__")
    assert any("left unmeasured" in r.getMessage() for r in caplog.records)
