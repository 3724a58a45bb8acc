"""Run `main()` in a fresh interpreter, under any launcher: what a program sees of
transfer_queue and mooncake.store once imported, as one JSON line. tests/test_invisible.py
runs it with and without dpobs and compares. It never names dpobs itself except through
the loopback launcher of TransferQueue (stdlib-only until start() imports ray).

Per module: its spec's loader (type, and whether __loader__ is that object), origin and
submodule locations; importlib.resources.files() (type, and the bytes of one resource);
inspect.getsource of the module; a class pickled by reference; a submodule imported after
it; importlib.reload. For transfer_queue also init() (its packaged config.yaml) on a local
Ray at 127.0.0.1 and one put and get. `measured` (whether a kv_* function or store method
is dpobs's) is reported apart: it is what differs by design.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.resources
import inspect
import json
import os
import pickle


def _digest(data) -> str:
    return hashlib.sha256(data if isinstance(data, bytes) else data.encode()).hexdigest()[:16]


def _try(fn):
    try:
        return fn()
    except Exception as exc:  # the same failure with and without dpobs is the same view
        return f"raises {type(exc).__name__}"


def _spec_view(mod) -> dict:
    spec = mod.__spec__
    return {"loader": f"{type(spec.loader).__module__}.{type(spec.loader).__qualname__}",
            "loader_is___loader__": mod.__loader__ is spec.loader,
            "origin": spec.origin, "locations": list(spec.submodule_search_locations or [])}


def module_view(name: str, package: str, resource: str, cls: str, later: str) -> dict:
    mod = importlib.import_module(name)
    files = importlib.resources.files(package)
    view = {**_spec_view(mod), "files": type(files).__qualname__,
            "files_of_module": _try(lambda: type(importlib.resources.files(mod)).__qualname__),
            "resource": _try(lambda: _digest(files.joinpath(resource).read_bytes())),
            "source": _try(lambda: _digest(inspect.getsource(mod))),
            "pickled": _try(lambda: pickle.loads(pickle.dumps(getattr(mod, cls)))
                            is getattr(mod, cls)),
            "later": _try(lambda: importlib.import_module(later).__spec__.origin)}
    return view


def reload_view(name: str) -> dict:
    mod = importlib.import_module(name)
    again = _try(lambda: importlib.reload(mod) is mod)
    return {"reload": again, "after_reload": _spec_view(mod)}


def _launcher_off_for_ray() -> None:
    """Ray's own helper processes (agents, workers) start without opentelemetry-instrument's
    sitecustomize: this process is what is compared, and on two busy cores their start-up
    under the launcher overran Ray's fixed 30 s wait for its node."""
    parts = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in parts if not p.rstrip(os.sep).endswith("auto_instrumentation"))


def init_view() -> dict:
    """transfer_queue.init() with its packaged config, then one put and get."""
    import torch
    import transfer_queue as tq
    from tensordict import TensorDict

    from dpobs_otel.testing.transferqueue import call, start, stop

    _launcher_off_for_ray()
    start()
    try:
        call(tq.kv_batch_put, keys=["a", "b"], partition_id="p",
             fields=TensorDict({"x": torch.arange(6).reshape(2, 3)}, batch_size=[2]))
        got = call(tq.kv_batch_get, keys=["a", "b"], partition_id="p")
        return {"init": "ok", "rows": [r.tolist() for r in got["x"].unbind()]}
    finally:
        stop()


def main() -> None:
    import mooncake.store
    import transfer_queue

    out = {"measured": {
        "transfer_queue": hasattr(transfer_queue.kv_batch_put, "__wrapped__"),
        "mooncake.store": hasattr(mooncake.store.MooncakeDistributedStore.put_tensor,
                                  "__wrapped__")}}
    out["transfer_queue"] = module_view("transfer_queue", "transfer_queue", "config.yaml",
                                        "TransferQueueClient", "transfer_queue.metrics")
    out["mooncake.store"] = module_view("mooncake.store", "mooncake", "mooncake_config.py",
                                        "MooncakeDistributedStore", "mooncake.mooncake_config")
    out["transfer_queue"].update(init_view())
    for name in ("transfer_queue", "mooncake.store"):
        out[name].update(reload_view(name))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
