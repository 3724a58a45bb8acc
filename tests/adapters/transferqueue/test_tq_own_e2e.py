"""TransferQueue's own end-to-end tests, shipped in its wheel (tests/e2e/), pass with
TransferQueueInstrumentor on, and dpobs serves exactly one op per kv_* call they made, each
failed call as an error of its type. Whichever TransferQueue release is installed: `make
compat` runs this file against each of 0.1.6-0.1.11 (compat/cells.toml).

The e2e tests run in a child pytest (their module-scoped Ray and TransferQueue), with the
plugin helpers/tq_own_e2e.py counting their calls above the instrumentor."""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from dpobs_otel.testing.transferqueue import LOOPBACK_ENV

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPO = os.path.dirname(TESTS)
E2E = "tests/e2e/test_kv_interface_e2e.py"  # every release 0.1.6-0.1.11 ships it


def _own_e2e():
    dist = importlib.metadata.distribution("transferqueue")
    path = dist.locate_file(E2E)
    assert path.exists(), f"transferqueue {dist.version} ships no {E2E}"
    return dist.version, str(path)


@pytest.mark.slow
@pytest.mark.parametrize("guard", [False, True], ids=["plain", "guard"])
def test_transferqueue_own_e2e_tests_pass_with_every_call_counted(tmp_path, guard):
    version, path = _own_e2e()
    out = tmp_path / "result.json"
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")  # not this repository's settings
    env = {**os.environ, **LOOPBACK_ENV, "DPOBS_TQ_E2E_OUT": str(out),
           "DPOBS_TQ_E2E_GUARD": "1" if guard else "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [REPO, TESTS,
                                                       os.environ.get("PYTHONPATH")]))}
    for var in ("DPOBS_ROLE", "DPOBS_RANK", "DPOBS_PORT", "DPOBS_SD_DIR", "DPOBS_AUTO"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-c", str(ini), "--rootdir", str(tmp_path),
         "-p", "no:cacheprovider", "-p", "helpers.tq_own_e2e", path],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    tail = f"transferqueue {version}:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, tail
    r = json.loads(out.read_text())
    assert r["collected"] > 0 and r["outcomes"] == {"call:passed": r["collected"]}, (r, tail)
    assert r["calls"] == r["served"], r  # one op per call, per op
    assert r["call_errors"] == r["served_errors"], r
    assert set(r["calls"]) == {"put", "get", "list", "clear"}, r
