"""file_sd files of dead processes are swept; files of live ones, of other boots on a shared
directory, and of other tools never are."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import dpobs_otel as dpobs
from dpobs_otel.exporters import filesd
from dpobs_otel.exporters.filesd import FileSDTarget, boot_id, start_ticks, sweep

pytestmark = pytest.mark.skipif(boot_id() is None, reason="needs Linux's boot id and /proc")

# A child that registers a target, says so, and waits to be killed.
CHILD = """
import sys, time
from dpobs_otel.exporters.filesd import FileSDTarget
t = FileSDTarget(sys.argv[1], "127.0.0.1:1", {"job": "j"}, name=sys.argv[2])
print(t.path, flush=True)
time.sleep(600)
"""


def spawn(sd_dir, name):
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(sd_dir), name],
                            stdout=subprocess.PIPE, text=True)
    path = proc.stdout.readline().strip()
    assert os.path.exists(path), path
    return proc, path


def kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_name_carries_boot_id_and_start_time(tmp_path):
    t = FileSDTarget(str(tmp_path), "127.0.0.1:1", {"job": "j"}, name="dpobs-j-r-0-1")
    try:
        base = os.path.basename(t.path)
        assert base == f"dpobs-j-r-0-1@{boot_id()}.{start_ticks()}.json"
        # the identity is in the name only: the labels are exactly what was asked for
        assert json.loads(open(t.path).read())[0]["labels"] == {"job": "j"}
    finally:
        t.remove()
    assert not os.path.exists(t.path)


def test_start_ticks_tells_two_processes_apart():
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert start_ticks(other.pid) is not None
        assert start_ticks(other.pid) >= start_ticks()
        assert start_ticks(2**22 + 1) is None  # no such pid
    finally:
        other.kill()
        other.wait()


def test_sigkilled_process_file_is_swept_live_ones_kept(tmp_path):
    dead, dead_path = spawn(tmp_path, "dead")
    live, live_path = spawn(tmp_path, "live")
    try:
        assert sweep(str(tmp_path)) == []  # both alive: nothing to remove
        kill(dead)
        assert os.path.exists(dead_path)  # SIGKILL ran no atexit handler
        assert sweep(str(tmp_path)) == [dead_path]
        assert not os.path.exists(dead_path) and os.path.exists(live_path)
    finally:
        kill(live)


def test_start_sweeps_before_registering(tmp_path, monkeypatch):
    monkeypatch.delenv("DPOBS_SD_DIR", raising=False)
    dead, dead_path = spawn(tmp_path, "dpobs-j-r-0-dead")
    kill(dead)
    tel = dpobs.start(role="r", sd_dir=str(tmp_path))
    try:
        files = sorted(p.name for p in tmp_path.glob("*.json"))
        assert len(files) == 1 and "dead" not in files[0], files
    finally:
        tel.shutdown()


def test_two_targets_in_one_process_do_not_sweep_each_other(tmp_path):
    a = FileSDTarget(str(tmp_path), "127.0.0.1:1", {}, name="a")
    b = FileSDTarget(str(tmp_path), "127.0.0.1:2", {}, name="b")  # sweeps on the way in
    try:
        assert os.path.exists(a.path) and os.path.exists(b.path)
        assert sweep(str(tmp_path)) == []
    finally:
        a.remove()
        b.remove()


def test_other_boot_is_kept_on_shared_dirs_and_removed_from_node_local_ones(tmp_path):
    other = tmp_path / "dpobs-x@0123456789ab.42.json"  # a boot id that is not ours
    assert boot_id() != "0123456789ab"
    other.write_text("[]")
    foreign = tmp_path / "someone-elses.json"  # no identity: another tool's file
    foreign.write_text("[]")
    assert sweep(str(tmp_path)) == [] and other.exists()
    assert sweep(str(tmp_path), node_local=True) == [str(other)]
    assert not other.exists() and foreign.exists()


def test_temporary_of_a_writer_killed_mid_write_is_swept(tmp_path):
    # A written, unlocked temporary: what a writer killed between write and rename leaves.
    stale = tmp_path / ".dpobs-abc.tmp"
    stale.write_text("[{}]")
    empty = tmp_path / ".dpobs-new.tmp"  # a writer that has not locked yet: left alone
    empty.write_text("")
    assert sweep(str(tmp_path)) == [str(stale)]
    assert empty.exists()


def test_replaced_file_is_not_removed_by_a_sweeper_that_locked_the_old_one(tmp_path,
                                                                          monkeypatch):
    path = tmp_path / f"n@{boot_id()}.1.json"
    path.write_text("[]")
    real_try_lock = filesd._try_lock

    def lock_then_replace(fd):
        ok = real_try_lock(fd)
        replacement = tmp_path / "new.tmp"
        replacement.write_text("[1]")
        os.replace(replacement, path)  # a new writer took the name meanwhile
        return ok
    monkeypatch.setattr(filesd, "_try_lock", lock_then_replace)
    assert filesd._remove_if_unlocked(str(path)) is False
    assert path.read_text() == "[1]"


def test_lock_survives_the_rename_and_dies_with_the_process(tmp_path):
    proc, path = spawn(tmp_path, "p")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert filesd._try_lock(fd) is False  # held by the writer, through the rename
        kill(proc)
        deadline = time.monotonic() + 10
        while not filesd._try_lock(fd):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.close(fd)
