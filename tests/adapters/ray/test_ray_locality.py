"""Ray's moving-data part and where its bytes were, on a live two-node Ray cluster on this
machine (helpers/ray_locality.py: node A the head, node B a second raylet and object store,
both on 127.0.0.1; one cluster for the module, three drivers on it: measured, plain, off).
Each driver's own node is "node" in its answer, the other "there", where its producer runs:
Ray 2.60 attaches a driver to the head, 2.49 to either raylet on the address.
The truth is Ray's own get_object_locations before each get, the driver's clock around it
and a digest of every value; dpobs's figures are the deltas of its own scrapes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from dpobs_otel import names
from dpobs_otel.testing.transferqueue import LOOPBACK_ENV
from helpers.ray_runs import run_job, sample, tests_path

pytestmark = pytest.mark.alone  # compares the driver's clock with dpobs's


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray-two-nodes")
    info = tmp / "info.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPOBS_", "OTEL_"))}
    env.update(LOOPBACK_ENV, PYTHONPATH=tests_path())
    proc = subprocess.Popen([sys.executable, "-m", "helpers.ray_locality", "--cluster",
                             str(info)], env=env, cwd=tmp, stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while not info.exists():
            assert proc.poll() is None and time.monotonic() < deadline, \
                proc.stderr.read().decode()[-3000:] if proc.poll() is not None else "no cluster"
            time.sleep(0.2)
        time.sleep(0.2)  # written whole: json.dumps then write_text, one small write
        yield json.loads(info.read_text())
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _drive(cluster, tmp_path_factory, name, **env):
    return run_job(tmp_path_factory.mktemp(name), "helpers.ray_locality",
                   RAYLOC_ADDRESS=cluster["address"], **env)


@pytest.fixture(scope="module")
def measured(cluster, tmp_path_factory):
    sd = tmp_path_factory.mktemp("ray-locality-sd")
    return _drive(cluster, tmp_path_factory, "measured", DPOBS_AUTO="1",
                  DPOBS_SD_DIR=str(sd), DPOBS_JOB="locality")


def _delta(run, step, role, name, **labels) -> float:
    """What `role`'s processes added to the sample between the step's two scrapes."""
    def total(scrapes):
        return sum(sample(t["samples"], name, 0.0, **labels) for t in scrapes
                   if t["labels"].get("role") == role and t["samples"])
    s = run["steps"][step]
    return total(s["after"]) - total(s["before"])


def _get(run, step, name, **labels) -> float:
    return _delta(run, step, "driver", name, op=names.RAY_GET, **labels)


MOVED, REMOTE, DATA = names.RAY_MOVED_SERIES, names.RAY_REMOTE_SERIES, names.RAY_DATA_SERIES
FETCH = names.RAY_FETCH_SERIES
WHOLE = names.OP_DURATION_SERIES + "_sum"
METHOD = "Producer.make"


def test_an_object_made_on_another_node_is_remote_its_bytes_ray_s_size(measured, cluster):
    truth = measured["steps"]["remote"]["truth"]
    assert {measured["node"], measured["there"]} == {cluster["a"], cluster["b"]}
    assert truth["nodes"] == [measured["there"]] and measured["there"] != measured["node"]
    assert _get(measured, "remote", MOVED, method=METHOD, locality="remote") == truth["size"]
    assert _get(measured, "remote", MOVED, method=METHOD, locality="local") == 0
    assert _get(measured, "remote", REMOTE, from_node=measured["there"]) == truth["size"]
    assert _get(measured, "remote", FETCH + "_count", locality="remote") == 1


def test_a_get_whose_producer_was_done_is_all_data_time(measured):
    data = _get(measured, "remote", DATA, method=METHOD)
    whole = _get(measured, "remote", WHOLE, method=METHOD)
    assert data == pytest.approx(whole, rel=1e-9) and data > 0
    assert data <= measured["steps"]["remote"]["truth"]["dt"]


def test_the_same_object_got_twice_is_local_the_second_time(measured):
    size = measured["steps"]["again"]["truth"]["size"]
    assert measured["node"] in measured["steps"]["again"]["truth"]["nodes"]
    assert _get(measured, "again", MOVED, method=METHOD, locality="local") == size
    assert _get(measured, "again", MOVED, method=METHOD, locality="remote") == 0
    assert _get(measured, "again", REMOTE, from_node=measured["there"]) == 0


def _ray_says_when_an_object_is_made() -> bool:
    """Ray 2.60's ObjectRef._on_ready. Before it (the nemo-rl cell's 2.49), an object not made
    yet when a get begins is `unknown` and that get's data time its deserialization
    (adapters/ray/locality.py); what existed before the get is placed as on 2.60."""
    import ray
    return hasattr(ray.ObjectRef, "_on_ready")


def test_a_get_that_waits_for_its_producer_counts_the_wait_out(measured):
    truth = measured["steps"]["slow"]["truth"]
    data = _get(measured, "slow", DATA, method=METHOD)
    whole = _get(measured, "slow", WHOLE, method=METHOD)
    assert truth["dt"] >= 2.0 and whole >= 2.0  # the producer slept 2 s
    assert 0 < data < 0.25 * whole
    told = _ray_says_when_an_object_is_made()
    where, other = ("remote", "unknown") if told else ("unknown", "remote")
    assert _get(measured, "slow", MOVED, method=METHOD, locality=where) == truth["size"]
    assert _get(measured, "slow", MOVED, method=METHOD, locality=other) == 0
    remote = _get(measured, "slow", REMOTE, from_node=measured["there"])
    assert remote == (truth["size"] if told else 0)


def test_a_get_of_objects_in_two_places_splits_their_bytes(measured):
    truth = measured["steps"]["mixed"]["truth"]
    assert truth["there"]["nodes"] == [measured["there"]]
    assert _get(measured, "mixed", MOVED, locality="local") + _get(
        measured, "mixed", MOVED, method="mixed", locality="local") == truth["here"]["size"]
    remote = _get(measured, "mixed", REMOTE, from_node=measured["there"])
    assert remote == truth["there"]["size"]
    assert _get(measured, "mixed", FETCH + "_count", locality="mixed") == 1


def test_a_worker_s_argument_by_ref_is_unknown_by_value_local(measured):
    """Ray's core fetches an argument passed by ref before any hook, and the worker's own
    table knows only its id: its bytes are Ray's size, its locality unknown (only Ray's task
    events tell; not read). One passed by value travels in the task: local."""
    truth = measured["steps"]["argument"]["truth"]
    assert truth["nodes"] == [measured["node"]]

    def args(step, method, locality):
        return _delta(measured, step, "Producer", MOVED, op=names.RAY_ARGS, method=method,
                      locality=locality)
    assert args("argument", "Producer.length", "unknown") == truth["size"]
    assert args("argument", "Producer.length", "remote") == 0
    assert args("remote", METHOD, "local") > 0 and args("remote", METHOD, "unknown") == 0


def test_a_spilled_object_is_restored_by_its_first_get_and_local_after(measured):
    truth = measured["steps"]["spilled"]["truth"]
    assert truth["did_spill"], "Ray did not spill the first of the puts"
    moved = {w: _delta(measured, "spilled", "driver", MOVED, op=names.RAY_GET, locality=w)
             for w in ("spilled", "local", "remote", "unknown")}
    assert moved == {"spilled": truth["size"], "local": truth["size"], "remote": 0,
                     "unknown": 0}
    assert _get(measured, "spilled", FETCH + "_count", locality="spilled") == 1


def test_each_process_names_its_own_node(measured):
    after = measured["steps"]["argument"]["after"]
    nodes = {t["labels"]["role"]: sample(t["samples"], names.RAY_NODE_SERIES, None,
                                         ray_node=measured["node"] if t["labels"]["role"] ==
                                         "driver" else measured["there"])
             for t in after if t["samples"]}
    assert nodes == {"driver": 1, "Producer": 1}


def test_a_step_s_data_plane_time_is_its_gets_data_part_never_the_wait(measured):
    """The headline: a step that waits 2 s for a producer on another node and then pulls
    4 MiB reads its pull; a step whose producer was done reads its whole get."""
    waited, done = measured["step_metrics"]["waited"], measured["step_metrics"]["done"]
    assert waited["get_s"] >= 2.0 and waited["dpobs/step_s"] >= waited["get_s"]
    assert 0 < waited["dpobs/data_plane_s"] < 0.25 * waited["get_s"]
    assert 0 < waited["dpobs/exposed_s"] <= waited["dpobs/data_plane_s"] + 1e-6
    assert waited["dpobs/busy_s"] == pytest.approx(waited["dpobs/exposed_s"], abs=1e-6)
    if _ray_says_when_an_object_is_made():  # else that get's data time is deserialization
        assert waited["dpobs/ray/ray_get/share"] > 0.5
    for window in (waited, done):  # the window's call (its submission) and get
        assert window["dpobs/data_plane_s"] == pytest.approx(sum(
            v for k, v in window.items() if k.startswith("dpobs/ray/") and
            k.endswith("/data_s")), rel=1e-9)
    assert 0.5 * done["get_s"] < done["dpobs/ray/ray_get/data_s"] <= done["get_s"]
    assert done["dpobs/exposed_s"] == pytest.approx(done["dpobs/ray/ray_get/data_s"],
                                                    rel=1e-6)
    assert done["dpobs/frac_of_step"] > 0.5


def test_results_are_the_same_with_and_without_dpobs_and_off_runs_nothing(
        measured, cluster, tmp_path_factory):
    plain = _drive(cluster, tmp_path_factory, "plain")
    off = _drive(cluster, tmp_path_factory, "off", DPOBS_AUTO="1", DPOBS_DISABLED="1")
    assert measured["digest"] == plain["digest"] == off["digest"]
    assert "dpobs_otel.adapters.ray.locality" in measured["loaded"]
    assert not measured["ray_get_is_rays"]
    assert off["loaded"] == [] and off["ray_get_is_rays"]
