"""verl's trainer steps as dpobs steps with no code change (adapters/verl/steps.py).

verl's real ray_trainer cannot be imported here (it needs torchdata and datasets, which the
suite does not install), so a stand-in takes its place in sys.modules: a module whose
`marked_timer` is verl's own (verl.utils.debug) and whose loop times each step as
RayPPOTrainer.fit does, through the name in its module globals. The instrumentor patches
that name, as it patches verl's module; auto.TARGETS names verl's module for DPOBS_AUTO
(tests/adapters/test_instrumentation.py)."""
from __future__ import annotations

import importlib.util
import sys
import time
import types

import pytest

import dpobs_otel as dpobs
from dpobs_otel import names
from dpobs_otel.adapters.verl import steps
from dpobs_otel.demo.report import metric_sum, scrape

pytestmark = pytest.mark.skipif(importlib.util.find_spec("verl") is None,
                                reason="verl is not installed")
STEPS = 4
FIT = '''
def fit(steps):
    out = []
    for _ in range(steps):
        timing_raw = {}
        with marked_timer("step", timing_raw):
            with marked_timer("gen", timing_raw, color="red"):
                time.sleep(0.03)
            with marked_timer("update_actor", timing_raw, color="red"):
                time.sleep(0.01)
        out.append(timing_raw)
    return out
'''


@pytest.fixture
def trainer(monkeypatch):
    from verl.utils.debug import marked_timer
    module = types.ModuleType(steps.MODULE)
    module.marked_timer, module.time = marked_timer, time
    exec(FIT, module.__dict__)
    monkeypatch.setitem(sys.modules, steps.MODULE, module)
    for var in [v for v in __import__("os").environ if v.startswith("DPOBS_")]:
        monkeypatch.delenv(var)
    tel = dpobs.start(role="driver", rank=0, job="verlsteps", port=0, host="127.0.0.1")
    inst = steps.VerlStepInstrumentor()
    inst.instrument(telemetry=tel)
    try:
        yield module, tel, marked_timer
    finally:
        inst.uninstrument()
        tel.shutdown()


def test_each_step_verl_times_is_a_dpobs_step(trainer):
    module, tel, _ = trainer
    timings = module.fit(STEPS)
    samples = scrape(tel.endpoint)
    assert metric_sum(samples, f"{names.STEP_DURATION_SERIES}_count") == STEPS
    verl_s = sum(t["step"] for t in timings)
    dpobs_s = metric_sum(samples, f"{names.STEP_DURATION_SERIES}_sum")
    # the dpobs step encloses verl's timer: never less, and only its own entry and exit more
    assert verl_s <= dpobs_s <= verl_s * 1.05, (verl_s, dpobs_s)
    assert all(t["gen"] >= 0.03 and t["update_actor"] >= 0.01 for t in timings)
    assert metric_sum(samples, names.INSTR_ERRORS_SERIES) == 0


def test_uninstrument_gives_verl_its_timer_back(trainer):
    module, _, marked_timer = trainer
    assert module.marked_timer is not marked_timer
    assert module.marked_timer.__wrapped__ is marked_timer
    steps.VerlStepInstrumentor().uninstrument()
    assert module.marked_timer is marked_timer
    steps.VerlStepInstrumentor().instrument()  # the fixture's uninstrument() finds it on


def test_a_step_whose_telemetry_cannot_start_is_verl_s_alone():
    from verl.utils.debug import marked_timer
    timed = steps.stepping(marked_timer, lambda: None)
    timing_raw: dict = {}
    with timed("step", timing_raw):
        pass
    assert set(timing_raw) == {"step"}
