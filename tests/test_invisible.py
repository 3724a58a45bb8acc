"""Zero-code enablement is invisible to the program (issue 31, item 1): a module imported
under DPOBS_AUTO=1 or `opentelemetry-instrument` looks, to everything but the functions dpobs
patches, exactly as without dpobs: its spec and loader (object, type, origin),
importlib.resources, inspect.getsource, pickling its classes, submodules imported later,
importlib.reload, and TransferQueue's init() with its packaged config.yaml. The off switch is
read before anything is hooked: DPOBS_AUTO=1 beside DPOBS_DISABLED=1 is plain Python.

Each row is one fresh interpreter running helpers.import_view (TransferQueue on a local Ray
at 127.0.0.1, Mooncake's store module), compared with the plain row."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(os.path.dirname(sys.executable), "opentelemetry-instrument")
# row -> (extra environment, launcher or None, dpobs patched the modules)
ROWS = {"DPOBS_AUTO": ({"DPOBS_AUTO": "1"}, None, True),
        "DPOBS_AUTO+DPOBS_DISABLED": ({"DPOBS_AUTO": "1", "DPOBS_DISABLED": "1"}, None, False),
        "opentelemetry-instrument": ({}, LAUNCHER, True)}


def import_view(env: dict, launcher: str | None) -> dict:
    """helpers.import_view.main() in a fresh interpreter: its JSON."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("DPOBS_", "OTEL_"))}
    full.update(env, DPOBS_HOST="127.0.0.1", DPOBS_PORT="0", MC_TCP_BIND_ADDRESS="127.0.0.1",
                OTEL_METRICS_EXPORTER="none", OTEL_TRACES_EXPORTER="none",
                OTEL_LOGS_EXPORTER="none",
                PYTHONPATH=os.pathsep.join([TESTS, *filter(None, [os.environ.get("PYTHONPATH")])]))
    cmd = [sys.executable, "-c", "from helpers.import_view import main; main()"]
    r = subprocess.run(([launcher] if launcher else []) + cmd, env=full, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def plain():
    pytest.importorskip("transfer_queue")
    pytest.importorskip("mooncake.store")
    view = import_view({}, None)
    assert view["measured"] == {"transfer_queue": False, "mooncake.store": False}
    assert view["transfer_queue"]["init"] == "ok"  # the baseline itself works
    return view


@pytest.mark.parametrize("row", list(ROWS))
def test_the_program_sees_what_it_sees_without_dpobs(plain, row):
    env, launcher, patched = ROWS[row]
    view = import_view(env, launcher)
    assert view.pop("measured") == {"transfer_queue": patched, "mooncake.store": patched}
    for module in ("transfer_queue", "mooncake.store"):
        for prop, seen in plain[module].items():
            assert view[module][prop] == seen, (module, prop)
