"""compat/run.py's choice of checks per cell (`--checks`), which .ci/run relies on to run
each cell of the matrix it can afford: read from the script itself, not a copy."""
from __future__ import annotations

import concurrent.futures
import importlib.util
import threading
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parent.parent / "compat" / "run.py"


@pytest.fixture(scope="module")
def run():
    spec = importlib.util.spec_from_file_location("compat_run", RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("spec, cell, want", [
    (None, "roll", None),
    ("", "roll", None),
    ("transferqueue,demo", "roll", ["transferqueue", "demo"]),
    ("roll=transferqueue/demo,nemo-rl=ray", "roll", ["transferqueue", "demo"]),
    ("roll=transferqueue/demo,nemo-rl=ray", "nemo-rl", ["ray"]),
    ("roll=transferqueue/demo,nemo-rl=ray", "newest", None),
    ("core+guard,nemo-rl=ray", "newest", ["core+guard"]),
    ("core+guard,nemo-rl=ray", "nemo-rl", ["ray"]),
])
def test_checks_for_picks_a_cell_s_own_entry_first(run, spec, cell, want):
    assert run.checks_for(cell, spec) == want


def test_the_alone_pass_waits_for_what_runs_beside_the_cell(run, monkeypatch):
    """The next cell's virtualenv build (and the downloads) may still run during the
    parallel pass, but must have ended before the `alone` pass, whose tests compare clocks."""
    build = concurrent.futures.Future()
    seen = []

    def sh(cmd, **kw):
        seen.append((cmd[-1], build.done()))
        if cmd[-1] == "parallel":  # the build ends a little after the parallel pass
            threading.Timer(0.05, build.set_result, (None,)).start()
        return 0, 0.0, "passed"

    monkeypatch.setattr(run, "sh", sh)
    monkeypatch.setattr(run, "checks", lambda *a: [("core+guard", ["parallel"]),
                                                   ("alone", ["alone"])])
    results = run.run_checks("cell", "python", [], {}, beside=[build, None])
    assert seen == [("parallel", False), ("alone", True)]
    assert [r["rc"] for r in results] == [0, 0]


@pytest.mark.parametrize("serial, want", [
    ((), [("core+guard,transferqueue,ray", True), ("alone", False), ("demo", False)]),
    (("transferqueue",), [("core+guard,ray", True), ("transferqueue (serial)", False),
                          ("alone", False), ("demo", False)]),
])
def test_a_cell_runs_its_serial_groups_in_a_pytest_of_their_own(run, monkeypatch, serial,
                                                                 want):
    """cells.toml's `serial`: those groups' tests in one process, every other group's in
    the workers, and every group's `alone` tests after both."""
    monkeypatch.setattr(run, "installed", lambda python: {"ray": "2.49.2"})
    monkeypatch.setattr(run, "WORKERS", 4)
    got = run.checks("/venv/bin/python", serial=serial)
    assert [(what, "-n" in cmd) for what, cmd in got] == want
    tests = {what: [a for a in cmd if a.startswith("tests/")] for what, cmd in got}
    serial_paths = [t for what, paths in tests.items() if "serial" in what for t in paths]
    assert serial_paths == ([] if not serial else run.ADAPTER)
    assert set(tests["alone"]) == set(run.CORE + run.ADAPTER + run.RAY)


def test_the_summary_names_each_failed_test_under_its_cell(run, monkeypatch):
    """CI shows the end of a log: the summary table must name what failed, since a failed
    check's own output scrolls out of that end behind the next cells'."""
    outs = {"parallel": (1, "....F.E\nFAILED tests/a.py::t - AssertionError: x\n"
                            "ERROR tests/b.py::u - OSError\n1 failed, 1 error"),
            "alone": (0, "FAILED looks like a summary line but the check passed\n1 passed")}
    monkeypatch.setattr(run, "sh", lambda cmd, **kw: (outs[cmd[-1]][0], 0.0, outs[cmd[-1]][1]))
    monkeypatch.setattr(run, "checks", lambda *a: [("core+guard", ["parallel"]),
                                                   ("alone", ["alone"])])
    results = run.run_checks("roll", "python", [], {})
    row = {"name": "roll", "versions": {}, "build_s": 1, "run_s": 2, "ok": False,
           "failed": ["core+guard"], "tests": [t for r in results for t in r["tests"]]}
    lines = run.table([row], 60).splitlines()
    assert lines[-3:] == ["roll: FAILED tests/a.py::t - AssertionError: x",
                          "roll: ERROR tests/b.py::u - OSError",
                          "0 of 1 passed; matrix time 1.0 min"]


def test_a_long_list_of_failures_is_cut_with_its_count(run):
    out = "\n".join(f"ERROR tests/m.py::t{i} - RuntimeError" for i in range(20))
    got = run.failures(out)
    assert got[:8] == [f"ERROR tests/m.py::t{i} - RuntimeError" for i in range(8)]
    assert got[8:] == ["... and 12 more"]


def test_a_row_s_verdict_names_its_failed_checks_and_their_tests(run):
    got = run.outcome([{"check": "build", "rc": 1, "s": 0.0},
                       {"check": "alone", "rc": 0, "s": 1.0, "tests": []},
                       {"check": "demo", "rc": 2, "s": 1.0, "tests": ["FAILED t"]}])
    assert got == {"ok": False, "failed": ["build", "demo"], "tests": ["FAILED t"]}
    assert run.outcome([{"check": "alone", "rc": 0, "s": 1.0}])["ok"]
