"""verl's trainer steps as dpobs steps with no code change (adapters/verl/steps.py).

verl's real ray_trainer needs torchdata, datasets and more that the suite does not install.
The last test imports it all the same, in a driver under DPOBS_AUTO=1, with empty modules
standing in for those; the others use a stand-in for the trainer module in sys.modules: a module whose
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


# A driver under DPOBS_AUTO=1 that imports verl's real trainer module and times its steps
# through the module's own `marked_timer`, looked up as RayPPOTrainer.fit looks it up. The
# trainer module's imports that this environment lacks (verl's data and PEFT stacks) stand
# in as empty modules: nothing of them runs before a trainer is built.
DRIVER = '''
import importlib.abc, importlib.util, json, sys, time, types

MISSING = {"torchdata", "datasets", "pandas", "peft", "accelerate", "cachetools"}
MISSING = {m for m in MISSING if importlib.util.find_spec(m) is None}


class Empty(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in MISSING:
            return importlib.util.spec_from_loader(name, self, is_package=True)

    def create_module(self, spec):
        return Empty(spec.name)

    def exec_module(self, module):
        module.__path__ = []


sys.meta_path.insert(0, StandIns())
from verl.trainer.ppo import ray_trainer
from dpobs_otel.demo.report import metric_sum, scrape
from dpobs_otel.readback.scrape import targets

verl_s = 0.0
for _ in range(STEPS):
    timing_raw = {}
    with ray_trainer.marked_timer("step", timing_raw):
        with ray_trainer.marked_timer("gen", timing_raw):
            time.sleep(0.02)
    verl_s += timing_raw["step"]
(target,) = targets(sys.argv[1], "verlauto")
samples = scrape(target.address)
print(json.dumps({"patched": hasattr(ray_trainer.marked_timer, "__wrapped__"),
                  "steps": metric_sum(samples, "STEPS_COUNT"),
                  "dpobs_s": metric_sum(samples, "STEPS_SUM"), "verl_s": verl_s}))
'''


def test_a_verl_driver_under_dpobs_auto_reports_its_steps(tmp_path):
    import json
    import os
    import subprocess
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.replace("STEPS_COUNT", f"{names.STEP_DURATION_SERIES}_count")
                      .replace("STEPS_SUM", f"{names.STEP_DURATION_SERIES}_sum")
                      .replace("range(STEPS)", f"range({STEPS})"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPOBS_")}
    env.update(DPOBS_AUTO="1", DPOBS_JOB="verlauto", DPOBS_ROLE="driver", DPOBS_PORT="0",
               DPOBS_HOST="127.0.0.1", DPOBS_SD_DIR=str(tmp_path / "sd"))
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "sd")], env=env,
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["patched"] and got["steps"] == STEPS
    assert got["verl_s"] <= got["dpobs_s"] <= got["verl_s"] * 1.05, got
