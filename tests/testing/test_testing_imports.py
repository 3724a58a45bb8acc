"""Importing a loopback launcher changes nothing: no environment variable, no process. Each
acts only when called (dpobs_otel/testing/)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

# Every module of dpobs_otel.testing imported, then the environment compared with the one
# the interpreter started with. In a child: this process has imported them already.
_CHILD = """
import importlib, json, os, pkgutil
before = dict(os.environ)
import dpobs_otel.testing as testing
names = [m.name for m in pkgutil.iter_modules(testing.__path__, testing.__name__ + ".")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"names": names, "changed": sorted(
    k for k in before.keys() | os.environ.keys() if before.get(k) != os.environ.get(k))}))
"""


def test_importing_dpobs_otel_testing_leaves_the_environment_unchanged():
    # Without the switches tests/conftest.py sets, so that setting them would show.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "MC_", "DPOBS_"))}
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"dpobs_otel.testing.transferqueue", "dpobs_otel.testing.mooncake"} <= set(
        found["names"])
    assert found["changed"] == []
