"""A backend that cannot start here (Mooncake's mooncake_master without libibverbs.so.1 exits
with 127 on a machine without the Debian package libibverbs1) costs one line naming the
missing piece: `dpobs compare` makes its table of the rest, `dpobs demo --backend X` exits 1
without a traceback. Simulated with a stand-in ldd and master, nothing uninstalled."""
from __future__ import annotations

import importlib.util
import os
import stat

import pytest

from dpobs_otel import cli
from dpobs_otel.demo import backends, compare
from dpobs_otel.testing import mooncake as mooncake_testing

LINE = "mooncake_master cannot load libibverbs.so.1 (apt install libibverbs1)"
needs_mooncake = pytest.mark.skipif(importlib.util.find_spec("mooncake") is None,
                                    reason="the mooncake wheel is not installed")


def _script(path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def no_libibverbs(tmp_path, monkeypatch):
    """An ldd that finds no libibverbs, and a master that exits as the loader makes it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "ldd", 'echo "\tlibibverbs.so.1 => not found"\n'
                             'echo "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6"\n')
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    master = _script(tmp_path / "mooncake_master",
                     'echo "$0: error while loading shared libraries: libibverbs.so.1: cannot '
                     'open shared object file: No such file or directory" >&2\nexit 127\n')
    monkeypatch.setattr(mooncake_testing, "master_binary", lambda: master)
    return bin_dir


def test_ldd_names_the_libraries_the_loader_cannot_find(no_libibverbs, tmp_path):
    assert backends.missing_libraries(str(tmp_path / "mooncake_master")) == ["libibverbs.so.1"]


def test_a_binary_whose_libraries_resolve_misses_none():
    import sys
    assert backends.missing_libraries(os.path.realpath(sys.executable)) == []


@needs_mooncake
def test_mooncake_is_unavailable_when_its_master_cannot_load_a_library(no_libibverbs):
    assert backends.available("mooncake") == LINE
    assert backends.available("memory") is None


@needs_mooncake
def test_a_master_that_exits_127_is_one_line_naming_the_library(no_libibverbs, monkeypatch):
    # the check before the start passes (a ldd that finds everything): the start tells
    monkeypatch.setattr(backends, "missing_libraries", lambda binary: [])
    with pytest.raises(backends.BackendUnavailable) as caught:
        backends.start("mooncake", 0.0, b"key")
    assert str(caught.value) == LINE


@needs_mooncake
def test_the_demo_on_a_backend_that_cannot_start_is_one_line_and_exit_1(no_libibverbs,
                                                                        monkeypatch, capfd,
                                                                        tmp_path):
    monkeypatch.setattr(backends, "missing_libraries", lambda binary: [])
    code = cli.main(["demo", "--backend", "mooncake", "--stack", "off", "--steps", "1",
                     "--log-dir", str(tmp_path / "logs")])
    err = capfd.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert err.splitlines()[-1] == f"dpobs demo: --backend mooncake cannot start: {LINE}"


@needs_mooncake
def test_the_demo_refuses_before_starting_when_the_check_fails(no_libibverbs, capfd):
    with pytest.raises(SystemExit) as caught:
        cli.main(["demo", "--backend", "mooncake", "--stack", "off", "--steps", "1"])
    assert str(caught.value) == f"dpobs demo: --backend mooncake cannot run here: {LINE}"


def test_compare_keeps_the_results_of_the_backends_that_ran(capsys):
    """measure_each is compare.collect's loop: a backend that cannot start, or fails, is a
    line; the others' results are kept for the table."""
    def one(name):
        if name == "mooncake":
            raise backends.BackendUnavailable(LINE)
        if name == "transferqueue":
            raise RuntimeError("controller died\nmore lines of its own")
        return {"ran": name}

    results = compare.measure_each(["memory", "mooncake", "transferqueue", "ray"], one)
    assert results == {"memory": {"ran": "memory"}, "ray": {"ran": "ray"}}
    assert capsys.readouterr().err.splitlines() == [
        f"dpobs compare: skipping mooncake: {LINE}",
        "dpobs compare: transferqueue failed (controller died); the table shows the rest"]


COMPARE = """
import sys
from dpobs_otel.testing import mooncake
mooncake.master_binary = lambda: {master!r}
from dpobs_otel import cli
if __name__ == "__main__":  # the workload's processes are spawned: they import this file
    sys.exit(cli.main(["compare", "--backends", "memory,mooncake", "--steps", "3",
                       "--log-dir", {logs!r}]))
"""


@pytest.mark.slow
@needs_mooncake
def test_compare_makes_its_table_of_the_rest_when_mooncake_cannot_start(tmp_path):
    """The issue's run, end to end: a real compare (Prometheus, the memory backend) whose
    mooncake_master exits with 127 as the loader makes it without libibverbs.so.1."""
    import subprocess
    import sys

    from dpobs_otel.testing.stack import binaries
    if not all(binaries().values()):
        pytest.skip("dpobs compare needs prometheus and alertmanager on PATH")
    master = _script(tmp_path / "mooncake_master",
                     'echo "$0: error while loading shared libraries: libibverbs.so.1: cannot '
                     'open shared object file: No such file or directory" >&2\nexit 127\n')
    script = tmp_path / "compare.py"
    script.write_text(COMPARE.format(master=master, logs=str(tmp_path / "logs")))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("dpobs compare:")] == [
        f"dpobs compare: skipping mooncake: {LINE}"]
    table = r.stdout[r.stdout.index("Backends side by side"):]
    assert "memory" in table.splitlines()[1] and "mooncake" not in table
