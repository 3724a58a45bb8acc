"""Faults injected into each part of the weight sync (issue 31's discipline for issue 34's
components): the user's weights pass through as the same objects, in order, with nothing
added or lost on the receiving side; the failure is counted under the `weights` component;
an error of the user's own stream reaches them as the same object; and once the fault is
gone the next sync is measured and checked as usual."""
from __future__ import annotations

import pytest
from helpers.weights import model

from dpobs_otel import names
from dpobs_otel.critical import CriticalPath
from dpobs_otel.tracing.tracer import Tracer
from dpobs_otel.weights import manifest
from dpobs_otel.weights import sync as sync_mod
from dpobs_otel.weights.meter import WeightMeter


class Injected(Exception):
    pass


def _raise(*args, **kwargs):
    raise Injected("injected")


FAULTS = {
    "fingerprint": (sync_mod, "fingerprint"),
    "manifest.encode": (manifest, "encode"),
    "manifest.decode": (manifest, "decode"),
    "manifest.compare": (manifest, "compare"),
    "meter.add": (WeightMeter, "add"),
    "step lookup": (CriticalPath, "owned_step"),
    "span": (Tracer, "weights"),
}


def _errors(tel) -> int:
    return tel.stats.instr_errors.get(names.COMPONENT_WEIGHTS, 0)


@pytest.mark.parametrize("where", FAULTS)
def test_a_fault_loses_nothing_and_is_counted(proving, monkeypatch, where):
    s, r = proving("trainer", trace=True), proving("rollout", trace=True)
    w = model()
    owner, attr = FAULTS[where]
    monkeypatch.setattr(owner, attr, _raise)
    with s.step():
        sent = list(s.weights.sent(iter(w.items()), version=1))
    got = list(r.weights.received(iter(sent), version=1))
    assert [(n, id(t)) for n, t in got] == [(n, id(t)) for n, t in w.items()]
    assert _errors(s) + _errors(r) >= 1
    monkeypatch.undo()
    before = r.weights.meter.stats.checked
    sent = list(s.weights.sent(iter(w.items()), version=2))
    list(r.weights.received(iter(sent), version=2))
    assert r.weights.meter.stats.checked - before == len(w)
    assert r.weights.meter.stats.version["receive"] == 2


def test_the_users_error_is_the_same_object_with_a_fault_too(proving, monkeypatch):
    s = proving("trainer")
    monkeypatch.setattr(sync_mod, "fingerprint", _raise)
    mine = ConnectionResetError("the wire")

    def stream():
        yield "a", model()["embed.weight"]
        raise mine

    with pytest.raises(ConnectionResetError) as caught:
        list(s.weights.sent(stream(), version=1))
    assert caught.value is mine
