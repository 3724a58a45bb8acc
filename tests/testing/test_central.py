"""dpobs_otel.testing: importing any of its modules changes nothing (no environment variable,
no process, no thread), and a loopback Central is a Prometheus whose query API is the
readback client's."""
from __future__ import annotations

import json
import pkgutil
import shutil
import subprocess
import sys

import pytest

import dpobs_otel.testing
from dpobs_otel.testing.prometheus import Central, rule_files

IMPORT_ALL = """
import importlib, json, os, sys, threading
env, threads = dict(os.environ), threading.active_count()
for name in sys.argv[1:]:
    importlib.import_module(name)
children = open(f"/proc/self/task/{os.getpid()}/children").read().split()
print(json.dumps({"env": dict(os.environ) == env, "threads": threading.active_count() - threads,
                  "children": children}))
"""


def test_importing_any_testing_module_changes_nothing():
    names = [f"dpobs_otel.testing.{m.name}"
             for m in pkgutil.iter_modules(dpobs_otel.testing.__path__)]
    assert "dpobs_otel.testing.prometheus" in names
    out = subprocess.run([sys.executable, "-c", IMPORT_ALL, *names], capture_output=True,
                         text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == {"env": True, "threads": 0, "children": []}


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs the prometheus binary")
def test_a_central_answers_through_the_readback_client(tmp_path):
    rules = rule_files(tmp_path / "mixin")
    assert {p.rsplit("/", 1)[1] for p in rules} == {"dpobs-alerts.rules.yml",
                                                    "dpobs-recording.rules.yml"}
    with Central(rules) as central:
        assert central.ready()
        assert central.query("1+1")[0]["value"] == 2.0
        assert {g["name"] for g in central.rules()}  # the mixin's groups loaded
        assert central.query_range("vector(1)", 0, 2, step=1)[0]["values"][0][1] == "1"
    assert central.proc is None
