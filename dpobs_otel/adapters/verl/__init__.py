"""verl's checkpoint engines (verl 0.9) measured as weight syncs, with no code change.

    opentelemetry-instrument python -m verl.trainer.main_ppo ...   # the launcher
    DPOBS_AUTO=1 python -m verl.trainer.main_ppo ...               # or the start-up hook
    VerlInstrumentor().instrument() / .uninstrument()              # or in code

Every weight refit in verl 0.9 goes through a `verl.checkpoint_engine.CheckpointEngine`:
the trainer's `send_weights(weights, global_steps)` and each rollout worker's
`receive_weights(global_steps)`. The instrumentor measures both on every subclass of that
base class, the backends verl ships and any registered later (a user's own, through
`CheckpointEngineRegistry` or `checkpoint_engine.custom_backend_module`), through
`tel.weights` (dpobs_otel/weights): one sync per call and side, its version the call's
`global_steps`. docs/guides/frameworks/verl.md says what is seen and what is not.

    instrumentor.py  VerlInstrumentor (entry point `verl`, DPOBS_AUTO=1)
    engines.py       the base class's subclasses, patched now and as they are defined
    calls.py         the measured methods, one per kind of function (async or not, generator
                     or not), each the same kind as the engine's own
    syncs.py         one call measured: its version, its stream through tel.weights
    package.py       the verl releases it instruments
    steps.py         VerlStepInstrumentor: the trainer's marked_timer("step") opens a dpobs
                     step (entry point `verl_steps`, DPOBS_AUTO=1 on verl's ray_trainer)

Only the instrumentor is imported with the package (the OpenTelemetry launcher loads every
entry point at start-up); torch and dpobs_otel.weights load on the first measured call.
"""
from __future__ import annotations

from .instrumentor import VerlInstrumentor
from .steps import VerlStepInstrumentor

__all__ = ["VerlInstrumentor", "VerlStepInstrumentor"]
