"""Telemetry and DisabledTelemetry offer one named interface (facade.TelemetryInterface), and
every adapter entry point works against both (issue 31, item 4): on, it measures; off, it
hands the user's own object back, or passes every call through, and never reaches a
method the disabled telemetry lacks. A new adapter entry point (the weight-sync ones) joins
ENTRY_POINTS."""
from __future__ import annotations

import ast
import inspect
import pathlib
import types

import pytest

import dpobs_otel as dpobs
from dpobs_otel.adapters.instrumentation import PerProcess
from dpobs_otel.facade import TelemetryInterface
from dpobs_otel.telemetry import DisabledTelemetry, Telemetry

ADAPTERS = pathlib.Path(dpobs.__file__).parent / "adapters"
INTERFACE = {n for n in [*dir(TelemetryInterface), *TelemetryInterface.__annotations__]
             if not n.startswith("_")}
# What adapters reach beyond the interface: only from objects built when `enabled` is true
# (the core's InstrumentedClient, InstrumentedMooncakeStore; the Ray adapter's RayMeter, which
# PerProcess builds only for an enabled Telemetry: its instruments on the Telemetry's meter,
# its account beside the core's stats).
BEYOND = {"critical", "meter", "stats", "op_duration"}


class _Store:
    """Any store object: what an adapter must hand back untouched when off."""

    def put(self, key, value):
        return ("stored", key)


def _entry_points(tel):
    """entry point -> (what it returned, whether that is the user's own object)."""
    from dpobs_otel.adapters import transferqueue
    from dpobs_otel.adapters.mooncake import instrument_store

    store, module = _Store(), types.SimpleNamespace(kv_put=lambda *a: None)
    stream = iter([])
    built = []
    per_process = PerProcess(lambda t: built.append(t) or object(), "test", tel)
    return {"tel.instrument": tel.instrument(store) is store,
            "transferqueue.instrument": transferqueue.instrument(tel, module) is module,
            "mooncake.instrument_store": instrument_store(tel, store) is store,
            "instrumentors' PerProcess": per_process.adapter() is None and not built,
            "tel.weights.sent": tel.weights.sent(stream, version=1) is stream,
            "tel.weights.received": tel.weights.received(stream, version=1) is stream}


def _params(fn) -> list:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_both_telemetries_derive_from_the_one_interface():
    assert issubclass(Telemetry, TelemetryInterface)
    assert issubclass(DisabledTelemetry, TelemetryInterface)
    assert not inspect.isabstract(Telemetry) and not inspect.isabstract(DisabledTelemetry)
    assert DisabledTelemetry.enabled is False and Telemetry.enabled is True
    for name in INTERFACE:  # same signature where both define it
        on, off = getattr(Telemetry, name), getattr(DisabledTelemetry, name)
        if inspect.isfunction(on):
            assert _params(on) == _params(off), name


def test_every_interface_method_runs_on_the_disabled_telemetry():
    tel = DisabledTelemetry()
    with tel, tel.step(), tel.waiting(), tel.codec("pack"):
        assert list(tel.exposed([1, 2])) == [1, 2]
    assert tel.step_metrics() == {} and tel.cluster_step_metrics("x") == {}
    assert tel.cluster_breakdown("x") == ([], [])
    tel.internal_error("client", ValueError("x"))
    with tel.weights.sync(version=1, side="receive") as sync:
        sync.note("w", object())
        assert sync.manifest() is None
    assert tel.endpoint is None and tel.settings is None and tel.guard is None


def test_adapters_reach_only_the_interface():
    reached = set()
    for path in ADAPTERS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name in ("tel", "_tel", "telemetry", "_given", "outer"):
                reached.add(node.attr)
    assert reached - INTERFACE - BEYOND == set()


def test_every_entry_point_hands_the_users_object_back_when_off():
    assert _entry_points(DisabledTelemetry()) == dict.fromkeys(
        ["tel.instrument", "transferqueue.instrument", "mooncake.instrument_store",
         "instrumentors' PerProcess", "tel.weights.sent", "tel.weights.received"], True)


def test_every_entry_point_measures_when_on(tel):
    assert _entry_points(tel) == dict.fromkeys(
        ["tel.instrument", "transferqueue.instrument", "mooncake.instrument_store",
         "instrumentors' PerProcess", "tel.weights.sent", "tel.weights.received"], False)


@pytest.mark.parametrize("switch", ["DPOBS_DISABLED", "OTEL_SDK_DISABLED"])
def test_the_instrumentors_patch_nothing_when_off(monkeypatch, switch):
    from dpobs_otel.adapters.instrumentation import Instrumentor

    class Probe(Instrumentor):
        def instrumentation_dependencies(self):
            return []

        def _instrument(self, **kwargs):
            raise AssertionError("instrumented while switched off")

        def _uninstrument(self, **kwargs):
            pass

    monkeypatch.setenv(switch, "true")
    assert Probe().instrument() is None
    assert dpobs.start().enabled is False
