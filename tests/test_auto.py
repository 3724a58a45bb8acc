"""DPOBS_AUTO=1: TransferQueue and Mooncake's store measured in any process the environment
reaches, through the start-up hook the package installs; nothing heavy imported where the
data plane is unused. (The Ray-actor case is in tests/adapters/transferqueue/test_transferqueue_instrumentor.py.)"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

HEAVY = ("torch", "ray", "opentelemetry", "tensordict", "transfer_queue")


def _python(code: str, **env) -> str:
    full = {k: v for k, v in os.environ.items() if not k.startswith("DPOBS_")}
    full.update(env)
    r = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip()


def test_the_hook_is_installed_beside_the_package():
    import sysconfig
    assert os.path.isfile(os.path.join(sysconfig.get_paths()["purelib"],
                                       "dpobs-otel-auto.pth")), "run `make install`"


@pytest.mark.parametrize("auto", ["1", ""])
def test_an_interpreter_that_never_touches_the_data_plane_imports_nothing_heavy(auto):
    out = _python(f"import sys, json; print(json.dumps([m for m in {HEAVY!r} "
                  "if m in sys.modules]))", DPOBS_AUTO=auto)
    assert json.loads(out) == []


def test_a_started_dpobs_imports_nothing_heavy_but_opentelemetry():
    """dpobs.start() runs in each process a measured op reaches (a Ray worker starts it on its
    first op, DPOBS_AUTO=1); a torch it imported there made every such op wait on torch's
    import (docs/development/testing.md, "Slow actor starts")."""
    out = _python("import sys, json, dpobs_otel as d; d.start(role='x', port=0); "
                  f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    assert json.loads(out) == ["opentelemetry"]


def test_importing_transfer_queue_instruments_it_only_when_asked():
    probe = ("import transfer_queue as tq, json; "
             "print(json.dumps(hasattr(tq.kv_batch_put, '__wrapped__')))")
    assert json.loads(_python(probe, DPOBS_AUTO="1")) is True
    assert json.loads(_python(probe, DPOBS_AUTO="0")) is False
    assert json.loads(_python(probe)) is False


@pytest.mark.skipif(importlib.util.find_spec("mooncake") is None,
                    reason="the mooncake wheel is not installed")
def test_importing_mooncake_store_instruments_it_only_when_asked():
    probe = ("import json; from mooncake.store import MooncakeDistributedStore as S; "
             "print(json.dumps(hasattr(S.put_tensor, '__wrapped__')))")
    assert json.loads(_python(probe, DPOBS_AUTO="1")) is True
    assert json.loads(_python(probe, DPOBS_AUTO="0")) is False
