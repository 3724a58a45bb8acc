"""What a Ray program can see of Ray, written as JSON so that a run with dpobs and one without
can be compared whole (tests/adapters/ray/test_ray_harmless.py): the signatures and `inspect`
answers of the entry points dpobs replaces, the types of refs and results, the exceptions
raised (class, module, message, identity of what the raiser threw), the results, and
whether the driver and an actor have torch imported (the program never imports it).

    python -m helpers.ray_view OUT.json

RAYVIEW_LACK=1 takes one private name of Ray away from what dpobs finds (shims/ray_private.py):
the public ops alone are then patched.

RAYVIEW_BREAK=NAME makes one dpobs component on a Ray op's path raise on purpose
(BREAKABLE: the method label, the refs' method (of a list, of one), the returned refs' map,
the object sizes); the view then also holds this process's op counts and dpobs's own error
count, read from its /metrics, so the test sees every op still counted and the program
unchanged.
"""
from __future__ import annotations

import inspect
import os
import sys
import urllib.request

from dpobs_otel.shims import ray_private

if os.environ.get("RAYVIEW_LACK"):  # a Ray without one of the private names dpobs reads,
    ray_private.NAMES += (("ray", "no_such_private_name"),)  # set before Ray is hooked

import ray  # noqa: E402  (DPOBS_AUTO hooks Ray as it is imported)
import ray.actor  # noqa: E402
import ray.remote_function  # noqa: E402

from dpobs_otel.adapters.instrumentation import MEASURED  # noqa: E402
from helpers.ray_runs import job_main  # noqa: E402

# component -> (module, attribute) that is made to raise
BREAKABLE = {"label": ("dpobs_otel.adapters.ray.methods", "Methods.label"),
             "of": ("dpobs_otel.adapters.ray.methods", "Methods.of"),
             "of_one": ("dpobs_otel.adapters.ray.methods", "Methods.of_one"),
             "returned": ("dpobs_otel.adapters.ray.methods", "Methods.returned"),
             "object_size": ("dpobs_otel.shims.ray_private", "object_size"),
             "stored_size": ("dpobs_otel.shims.ray_private", "stored_size")}


class Planted(RuntimeError):
    """What a broken component raises: dpobs must swallow and count it."""


@ray.remote
class Echo:
    def echo(self, x, *, twice=False):
        return [x, x] if twice else x

    def fail(self):
        raise KeyError("planted by the program")

    def has_torch(self):
        return "torch" in sys.modules


@ray.remote
def double(x):
    return x * 2


def _break(component: str) -> None:
    import importlib

    from dpobs_otel.adapters.ray import ops
    if ops.FAST is not None and component in ("object_size", "stored_size"):
        ops.FAST.plant(component)  # the C op path reads sizes itself (_fast.c)
        return
    module, path = BREAKABLE[component]
    owner = importlib.import_module(module)
    *head, attr = path.split(".")
    for part in head:
        owner = getattr(owner, part)

    def broken(*args, **kwargs):
        raise Planted(component)
    setattr(owner, attr, broken)


def _signature(fn) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError) as exc:
        return f"no signature: {type(exc).__name__}"


def _entry_points() -> dict:
    fns = {"ray.put": ray.put, "ray.get": ray.get, "ray.wait": ray.wait,
           "ActorMethod._remote": ray.actor.ActorMethod._remote,
           "RemoteFunction._remote": ray.remote_function.RemoteFunction._remote}
    return {name: {"signature": _signature(fn), "name": fn.__name__,
                   "replaced": hasattr(fn, MEASURED),
                   "qualname": fn.__qualname__, "doc": fn.__doc__,
                   "module": fn.__module__, "source": inspect.getsource(fn),
                   "function": inspect.isfunction(fn),
                   "coroutine": inspect.iscoroutinefunction(fn)}
            for name, fn in fns.items()}


def _raised(fn) -> dict:
    try:
        fn()
    except Exception as exc:
        return {"class": type(exc).__name__, "module": type(exc).__module__,
                "mro": [c.__name__ for c in type(exc).__mro__],
                "cause": type(getattr(exc, "cause", None)).__name__,
                "cause_message": str(getattr(exc, "cause", exc))}
    return {}


def view() -> dict:
    echo = Echo.remote()
    ref = ray.put({"rows": list(range(1000))})
    call = echo.echo.remote(ref, twice=True)
    # No timeout: the answer is [2, 0] only if the wait never times out, and on 2 busy cores
    # (a CI matrix cell beside the next cell's virtualenv build) a measured run's first actor
    # took over 60 s to start. run_job's own limit bounds a hang.
    ready, pending = ray.wait([call, double.remote(21)], num_returns=2, timeout=None)
    return {"entry_points": _entry_points(),
            "ref_type": type(ref).__module__ + "." + type(ref).__qualname__,
            "call_type": type(call).__qualname__,
            "wait": [len(ready), len(pending)],
            "results": [ray.get(call), ray.get(double.remote(21)), ray.get([ref, ref])],
            "method_signature": _signature(echo.echo.remote),
            "raised": _raised(lambda: ray.get(echo.fail.remote())),
            "bad_input": _raised(lambda: ray.get("not a ref")),
            "timeout": _raised(lambda: ray.get(echo.echo.remote(1), timeout=-1)),
            # A program that never imports torch: dpobs must not either, in the driver or in
            # a worker (each measured process starts dpobs on its first op).
            "torch_imported": ["torch" in sys.modules, ray.get(echo.has_torch.remote())]}


def _own_counts() -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    from dpobs_otel import names
    tel = ray_instrumented_telemetry()
    if tel is None:
        return {}
    body = urllib.request.urlopen(f"http://{tel.endpoint}/metrics", timeout=10).read()
    out = {"calls": {}, "errors": 0, "lacking": 0}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == names.OP_DURATION_SERIES + "_count":
                op = s.labels["op"]
                out["calls"][op] = out["calls"].get(op, 0) + s.value
            elif s.name == names.INSTR_ERRORS_SERIES and s.labels["component"] == "ray":
                out["errors"] += s.value
            elif (s.name == names.INSTR_ERRORS_SERIES
                  and s.labels["component"] == names.COMPONENT_RAY_PRIVATE):
                out["lacking"] += s.value
    return out


def ray_instrumented_telemetry():
    from dpobs_otel.adapters.ray import RayInstrumentor
    per_process = getattr(RayInstrumentor(), "_per_process", None)
    return None if per_process is None else per_process.telemetry()


def main() -> None:
    broken = os.environ.get("RAYVIEW_BREAK")
    if broken:
        _break(broken)
    job_main(lambda: {**view(), "own": _own_counts()}, address="local", num_cpus=2,
             include_dashboard=False)


if __name__ == "__main__":
    main()
