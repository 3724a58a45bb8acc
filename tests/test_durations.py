"""The suite's time limit (helpers/durations.py): a test over the limit fails the run unless it
is allowlisted, every test's own outcome stays as it was, the slowest are printed; and every
allowlist entry names a test that exists, with its reason."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.slow_allowlist import ALLOWED

TESTS = Path(__file__).resolve().parent

CONFTEST = """
from helpers.durations import SlowTests

def pytest_configure(config):
    config.pluginmanager.register(
        SlowTests(limit_s=0.5, allowed={"test_a.py::test_listed": "it has to"}, shown=2),
        "slow-under-test")
"""
# time.sleep never returns early, so both sleepers are over the limit on any machine.
TESTS_A = """
import time

def test_listed():
    time.sleep(0.8)

def test_unlisted():
    time.sleep(0.8)

def test_quick():
    pass
"""


@pytest.fixture
def project(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_a.py").write_text(TESTS_A)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return tmp_path


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=120)


def test_an_unlisted_test_over_the_limit_fails_the_run_and_nothing_else(project):
    run = _pytest(project)
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    # Every test keeps its own outcome: the run fails, no test does.
    assert "3 passed" in out and "failed" not in out.split("slowest tests")[0], out
    table, verdict = out.split("slowest tests", 1)[1].split("over the 0.5 s limit", 1)
    # The two slowest are printed (shown=2), the allowlisted one marked as such.
    assert "test_a.py::test_listed [allowlisted]" in table
    assert "test_a.py::test_unlisted" in table and "test_quick" not in table
    assert "over the 0.5 s limit and not on the allowlist: 1 " in out
    assert "test_a.py::test_unlisted" in verdict and "test_listed" not in verdict
    assert "tests/helpers/slow_allowlist.py" in verdict


def test_an_allowlisted_test_over_the_limit_passes(project):
    run = _pytest(project, "-k", "test_listed or test_quick")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout and "over the" not in run.stdout


def test_a_failing_run_keeps_its_exit_status(project):
    (project / "test_b.py").write_text("def test_fails():\n    assert False\n")
    run = _pytest(project)
    assert run.returncode == 1 and "1 failed, 3 passed" in run.stdout, run.stdout


def _defined(path: Path) -> set[str]:
    """Test functions of a module as ids under it: `name` and `Class::name`."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.ClassDef):
            out.update(f"{node.name}::{f.name}" for f in node.body
                       if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return out


def test_no_test_is_listed_twice():
    """A repeated key in a dict literal is no error: the second entry silently replaces the
    first, and its reason with it."""
    tree = ast.parse((TESTS / "helpers" / "slow_allowlist.py").read_text())
    [listed] = [node.value for node in tree.body
                if isinstance(node, ast.AnnAssign) and node.target.id == "ALLOWED"]
    keys = [ast.literal_eval(key) for key in listed.keys]
    assert len(keys) == len(set(keys)) == len(ALLOWED)


@pytest.mark.parametrize("nodeid", sorted(ALLOWED))
def test_every_allowlist_entry_names_a_test_and_says_why(nodeid):
    path, _, name = nodeid.partition("::")
    assert path.startswith("tests/") and (TESTS.parent / path).is_file(), nodeid
    assert name.split("[", 1)[0] in _defined(TESTS.parent / path), nodeid
    assert len(ALLOWED[nodeid].split()) >= 3, f"{nodeid}: say why it may be slow"


def test_a_limit_of_zero_prints_the_slowest_and_fails_nothing():
    # make compat's cells pass --slow-limit=0 (tests/conftest.py): make test enforces it.
    from types import SimpleNamespace

    from helpers.durations import SlowTests
    plugin = SlowTests(limit_s=0, allowed={})
    for when, seconds in (("setup", 50.0), ("call", 70.0), ("teardown", 1.0)):
        plugin.pytest_runtest_logreport(SimpleNamespace(nodeid="t.py::slow", when=when,
                                                        duration=seconds))
    session = SimpleNamespace(exitstatus=pytest.ExitCode.OK)
    plugin.pytest_sessionfinish(session)
    assert session.exitstatus == pytest.ExitCode.OK and plugin.over == []
    assert plugin.total("t.py::slow") == 121.0
    enforcing = SlowTests(limit_s=60, allowed={})
    enforcing.phases = plugin.phases
    enforcing.pytest_sessionfinish(session)
    assert session.exitstatus == pytest.ExitCode.TESTS_FAILED
    assert enforcing.over == [("t.py::slow", 121.0)]


def test_the_limit_stretches_with_more_workers_than_cores():
    from helpers.durations import limit_for
    assert limit_for(60, None, 2) == 60  # a serial run
    assert limit_for(60, "auto", 2) == 60  # one worker a core
    assert limit_for(60, 2, 2) == 60 and limit_for(60, 4, 16) == 60
    assert limit_for(60, 4, 2) == 120  # make test here: four workers on 2 cores
    assert limit_for(0, 4, 2) == 0  # no verdict stays none
