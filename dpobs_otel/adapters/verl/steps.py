"""verl's training steps as dpobs steps, with no code change.

    DPOBS_AUTO=1 python -m verl.trainer.main_ppo ...      # the start-up hook (auto.py)
    opentelemetry-instrument python -m verl.trainer.main_ppo ...
    VerlStepInstrumentor().instrument(telemetry=tel)      # or in code

verl's trainer times each step on its single controller with
`with marked_timer("step", timing_raw):` (RayPPOTrainer.fit in
verl/trainer/ppo/ray_trainer.py), a name that module imports from verl.utils.debug and looks
up in its own globals at every call. The instrumentor puts a marked_timer there that, for
the name "step" alone, opens `tel.step()` around verl's own timer, so the process that runs
fit() (the driver, or main_ppo's TaskRunner actor) has steps: frac_of_step and step_metrics
then have their denominator. Every other name is verl's own timer, untouched. dpobs starts at
the first step (settings from DPOBS_*; role `driver` unless DPOBS_ROLE says otherwise); if it
cannot, the step is verl's alone. uninstrument() puts verl's marked_timer back.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import logging
from typing import Collection

from ..instrumentation import Instrumentor, PerProcess
from .package import _instruments

__all__ = ["VerlStepInstrumentor"]
log = logging.getLogger(__name__)
MODULE = "verl.trainer.ppo.ray_trainer"
STEP = "step"  # the name fit() times each whole step under


def stepping(timer, telemetry):
    """verl's marked_timer, with a dpobs step around the one named STEP. telemetry() is the
    process's Telemetry, or None when dpobs cannot run here."""
    @functools.wraps(timer)
    def marked_timer(name, *args, **kwargs):
        inner = timer(name, *args, **kwargs)
        if name != STEP:
            return inner
        try:
            tel = telemetry()
        except Exception:  # never fail verl's step over dpobs's own start
            log.debug("dpobs: no step for verl's timer", exc_info=True)
            tel = None
        return inner if tel is None else _both(tel.step(), inner)
    marked_timer.__dpobs_step__ = True
    return marked_timer


@contextlib.contextmanager
def _both(step, inner):
    """The dpobs step outside verl's timer: verl's own time is all inside the step."""
    with step, inner:
        yield


class VerlStepInstrumentor(Instrumentor):
    """See the module docstring. One instance per process (BaseInstrumentor is a singleton)."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs):
        module = importlib.import_module(MODULE)
        self._module, self._timer = module, module.marked_timer
        if getattr(self._timer, "__dpobs_step__", False):  # already ours (another loader)
            self._timer = self._timer.__wrapped__
        self._per_process = PerProcess(lambda tel: tel, "verl's trainer step",
                                       kwargs.get("telemetry"), lambda: {"role": "driver"})
        module.marked_timer = stepping(self._timer, self._per_process.adapter)

    def _uninstrument(self, **kwargs):
        self._module.marked_timer = self._timer
        self._per_process.close()
