"""The binaries the rule tests run (promtool, amtool, prometheus): found on PATH or the test
fails saying what to install, and run with their output kept for the failure's message."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH; install Prometheus/Alertmanager (see .ci/run)")
    return path


def run(*cmd: str | Path) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{out}"
    return out
