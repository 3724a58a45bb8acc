"""Backends' own logs go to a file per backend; the terminal keeps dpobs's progress and tables.
The unit tests write the way backends do (raw descriptors, child processes); the end-to-end
test runs `dpobs compare` on every backend this machine has and reads what a person sees."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from dpobs_otel.demo.backends import available
from dpobs_otel.demo.logs import BackendLog
from helpers import IN_CI

# A line dpobs writes to the terminal during `dpobs compare` (stderr); stdout is the table.
OURS = re.compile(r"^(Prometheus http\S+|\w+: its logs go to \S+|== \w+: \d+ measured steps .*"
                  r"|\[[#.]+\] .*|dpobs compare: skipping .*|)$")
GLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d", re.M)


def test_descriptors_and_children_go_to_the_file_ours_to_the_terminal(tmp_path, capfd):
    with BackendLog(tmp_path, "chatty") as log:
        os.write(1, b"raw stdout\n")
        os.write(2, b"raw stderr\n")
        subprocess.run(["sh", "-c", "echo child out; echo child err >&2"], check=True)
        print("dpobs progress", file=log.err)
        print("dpobs table", file=log.out)
    seen = capfd.readouterr()
    assert "dpobs table" in seen.out and "dpobs progress" in seen.err
    assert f"chatty: its logs go to {log.path}" in seen.err
    terminal = (seen.out + seen.err).replace(str(log.path), "LOG")
    assert "raw" not in terminal and "child" not in terminal
    assert log.path.read_text().split() == "raw stdout raw stderr child out child err".split()
    os.write(2, b"after\n")  # the descriptors are back
    assert "after" in capfd.readouterr().err


def test_a_failing_backend_shows_the_tail_of_its_file(tmp_path, capfd):
    with pytest.raises(RuntimeError, match="boom"):
        with BackendLog(tmp_path, "broken"):
            os.write(2, b"".join(b"line %d\n" % i for i in range(100)))
            raise RuntimeError("boom")
    err = capfd.readouterr().err
    assert f"broken failed; the last lines of {tmp_path / 'broken.log'}" in err
    assert "line 99" in err and "line 60" in err and "line 59\n" not in err


@pytest.mark.slow
def test_a_comparison_s_terminal_holds_no_backend_log_line(tmp_path):
    backends = ["memory"] + [b for b in ("transferqueue", "mooncake") if available(b) is None]
    if IN_CI:
        assert len(backends) == 3, "CI installs every backend"
    r = subprocess.run([sys.executable, "-m", "dpobs_otel.cli", "compare", "--steps", "3",
                        "--backends", ",".join(backends), "--log-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    foreign = [line for line in r.stderr.splitlines() if not OURS.match(line)]
    assert not foreign, "backend lines on the terminal:\n" + "\n".join(foreign[:20])
    assert r.stdout.lstrip().startswith("Backends side by side")
    assert not GLOG.search(r.stdout) and "ray" not in r.stdout.lower()
    for name in backends:
        assert f"{name}: its logs go to {tmp_path / (name + '.log')}" in r.stderr
    # The backends did talk: their lines are in their files (else this test proves nothing).
    if "mooncake" in backends:
        assert GLOG.search((tmp_path / "mooncake.log").read_text())
    if "transferqueue" in backends:
        assert (tmp_path / "transferqueue.log").read_text().strip()
