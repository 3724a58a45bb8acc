"""The switch matrix (issue 31, item 2): every way of enabling dpobs x every position of its
off switch, each row one fresh interpreter running every client kind (helpers.switch_row)
against one TransferQueue (local Ray at 127.0.0.1) and one Mooncake master shared by the rows.

    launcher: plain python (dpobs installed, not enabled) | DPOBS_AUTO=1 |
              opentelemetry-instrument | in code (dpobs.start + the adapters)
    switch:   on | DPOBS_DISABLED=1 | OTEL_SDK_DISABLED=true

In every row the program gets what the plain row gets. On, dpobs's counts are exactly
EXPECTED[launcher][kind]; off, no count, no file in the sd directory, no socket more than
the plain row listens on, and (zero-code launchers) no module beyond what the same launcher
imports without dpobs: for opentelemetry-instrument, the launcher with dpobs's
instrumentors excluded (OTEL_PYTHON_DISABLED_INSTRUMENTATIONS); for DPOBS_AUTO, plain
python, plus the start-up hook's own stdlib-only modules.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("transfer_queue")
pytest.importorskip("mooncake.store")

from dpobs_otel.testing.mooncake import MooncakeMaster  # noqa: E402
from dpobs_otel.testing.transferqueue import LOOPBACK_ENV, start, stop  # noqa: E402

TESTS = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.join(os.path.dirname(sys.executable), "opentelemetry-instrument")
OURS = "transfer_queue,mooncake,verl"  # dpobs's entry points (pyproject.toml)
LAUNCHERS = {"plain": ([], {}), "DPOBS_AUTO": ([], {"DPOBS_AUTO": "1"}),
             "opentelemetry-instrument": ([LAUNCHER], {}), "in code": ([], {"M_IN_CODE": "1"})}
SWITCHES = {"on": {}, "DPOBS_DISABLED": {"DPOBS_DISABLED": "1"},
            "OTEL_SDK_DISABLED": {"OTEL_SDK_DISABLED": "true"}}
OFF = [s for s in SWITCHES if s != "on"]
# The zero-code launchers' baselines: the same launcher and switch, dpobs left out.
BASELINES = {s: ([LAUNCHER], {**SWITCHES[s], "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": OURS})
             for s in OFF}
# What the DPOBS_AUTO start-up hook itself imports (stdlib only), and the modules the
# OpenTelemetry launcher loads for dpobs's entry points; nothing else of dpobs when off.
HOOK_MODULES = {"dpobs_otel", "dpobs_otel.auto", "dpobs_otel.config", "dpobs_otel.version"}
ENTRY_POINT_MODULES = HOOK_MODULES | {
    f"dpobs_otel.adapters{m}" for m in (
        "", ".instrumentation", ".transferqueue", ".transferqueue.instrumentor",
        ".transferqueue.package", ".mooncake", ".mooncake.instrumentor", ".mooncake.package",
        ".verl", ".verl.instrumentor", ".verl.package")}

# Calls counted per client kind, with dpobs on.
KV = {"put": 1, "get": 1, "list": 1, "clear": 1}
CLIENT = {"put": 1, "claim_meta": 1, "get_data": 1, "clear": 1}
STORE = {"put": 1, "get": 1, "clear": 1}
ZERO_CODE = {"tq_kv": KV, "tq_kv_async": KV, "tq_client": CLIENT, "tq_client_async": CLIENT,
             "mooncake_store": STORE, "memory": {}, "memory_async": {},
             "mooncake_plane": {}, "mooncake_plane_async": {}}
EXPECTED = {"plain": dict.fromkeys(ZERO_CODE, {}), "DPOBS_AUTO": ZERO_CODE,
            "opentelemetry-instrument": ZERO_CODE,
            "in code": {**ZERO_CODE, "memory": KV, "memory_async": KV,
                        "mooncake_plane": KV, "mooncake_plane_async": KV}}


def _run(name: str, argv: list, env: dict, backends: dict, tmp) -> dict:
    sd = tmp / name.replace(" ", "_").replace("+", "_")
    sd.mkdir()
    full = {k: v for k, v in os.environ.items() if not k.startswith(("DPOBS_", "OTEL_", "M_"))}
    full.update(LOOPBACK_ENV, **backends, **env, M_ROW=f"r{abs(hash(name)) % 10**6}",
                DPOBS_SD_DIR=str(sd), DPOBS_HOST="127.0.0.1", DPOBS_PORT="0",
                MC_TCP_BIND_ADDRESS="127.0.0.1", OTEL_METRICS_EXPORTER="none",
                OTEL_TRACES_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
                PYTHONPATH=os.pathsep.join([TESTS, *filter(None, [os.environ.get("PYTHONPATH")])]))
    cmd = [*argv, sys.executable, "-c", "from helpers.switch_row import main; main()"]
    r = subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=300)
    if r.returncode:  # the row's own tests fail on it, the other rows still run
        return {"error": r.stderr[-4000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def _view(matrix, row) -> dict:
    view = matrix[row]
    assert "error" not in view, view.get("error")
    return view


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """row -> its view: every row, and the baselines, against one TransferQueue and one
    Mooncake master. Prints the matrix's size and time."""
    tmp = tmp_path_factory.mktemp("matrix")
    t0 = time.perf_counter()
    handle = start()
    try:
        with MooncakeMaster() as master:
            backends = {"M_RAY": handle.ray_address, "M_RPC": master.rpc_address,
                        "M_META": master.metadata_url}
            rows = {(launcher, switch): _run(f"{launcher}+{switch}", argv,
                                             {**env, **SWITCHES[switch]}, backends, tmp)
                    for launcher, (argv, env) in LAUNCHERS.items() for switch in SWITCHES}
            for switch, (argv, env) in BASELINES.items():
                rows[("baseline", switch)] = _run(f"baseline+{switch}", argv, env, backends,
                                                  tmp)
    finally:
        stop()
    print(f"\nswitch matrix: {len(rows)} processes x {len(ZERO_CODE)} client kinds "
          f"in {time.perf_counter() - t0:.0f}s")
    return rows


ROWS = [(launcher, switch) for launcher in LAUNCHERS for switch in SWITCHES]


@pytest.mark.parametrize("row", ROWS, ids=["+".join(r) for r in ROWS])
def test_the_program_gets_what_it_gets_without_dpobs(matrix, row):
    assert _view(matrix, row)["results"] == _view(matrix, ("plain", "on"))["results"]


@pytest.mark.parametrize("row", ROWS, ids=["+".join(r) for r in ROWS])
def test_counts_are_exact_on_and_nothing_off(matrix, row):
    launcher, switch = row
    want = EXPECTED[launcher] if switch == "on" else dict.fromkeys(ZERO_CODE, {})
    view = _view(matrix, row)
    assert view["counts"] == want
    served = switch == "on" and launcher != "plain"
    assert bool(view["written"]) == served
    assert view["listening"] == _view(matrix, ("plain", "on"))["listening"] + served


@pytest.mark.parametrize("switch", OFF)
@pytest.mark.parametrize("launcher", ["DPOBS_AUTO", "opentelemetry-instrument"])
def test_off_imports_nothing_beyond_the_launcher(matrix, launcher, switch):
    base, allowed = ((("plain", "on"), HOOK_MODULES) if launcher == "DPOBS_AUTO"
                     else (("baseline", switch), ENTRY_POINT_MODULES))
    extra = set(_view(matrix, (launcher, switch))["modules"]) - set(_view(matrix, base)["modules"])
    assert extra - allowed == set()
