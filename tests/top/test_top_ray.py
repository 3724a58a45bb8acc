"""`dpobs top --prometheus`'s lines of Ray's object store: per job, op and method the seconds and
bytes per step, the bytes each process owns, each node's store; from canned records, and live
under tmux against `dpobs demo --backend ray` on the demo's stack, each cell against the
recording rule queried from the same Prometheus."""
from __future__ import annotations

import importlib.util
import os
import re
import sys
import time
from pathlib import Path

import pytest

from dpobs_otel import names
from dpobs_otel.demo import ray_plane
from helpers.top import Canned, Tmux, number, stamp, table, text

METHODS = "Ray ops per method (per step)"
STORE = "Ray store: owned bytes, nodes"
GEN = ray_plane.GEN

ANSWERS = {
    names.JOB_OP_METHOD_RAY_SECONDS_PER_STEP: [
        ({"job": "rj", "op": "ray_get", "method": GEN}, 0.125),
        ({"job": "rj", "op": "ray_put"}, 0.002)],
    names.JOB_OP_METHOD_DIRECTION_RAY_BYTES_PER_STEP: [
        ({"job": "rj", "op": "ray_get", "method": GEN, "direction": "read"}, 400e3),
        ({"job": "rj", "op": "ray_put", "direction": "write"}, 500e3)],
    names.INSTANCE_RAY_OWNED_BYTES: [
        ({"job": "rj", "role": "driver", "rank": "0", "instance": "h:1"}, 2.5e6),
        ({"job": "rj", "role": "rollout", "rank": "0", "instance": "h:2"}, 0.0)],
    names.JOB_NODE_RAY_STORE_USED: [({"job": "rj", "node": "n1"}, 0.97)],
    names.JOB_NODE_RAY_SPILLED_BYTES: [({"job": "rj", "node": "n1"}, 1e6)],
}


def test_the_records_become_one_line_per_method_owned_bytes_and_nodes():
    a = Canned(ANSWERS).answers()
    got = [(x.op, x.method, x.seconds_per_step, x.bytes_per_step) for x in a.ray.lines]
    assert got == [("ray_get", GEN, 0.125, 400e3), ("ray_put", "", 0.002, 500e3)]
    assert [(o.role, o.bytes) for o in a.ray.owned] == [("driver", 2.5e6)]  # none: no line
    rows = table(text(a), METHODS)
    assert [(r["method"], number(r["s/step"]), number(r["bytes/step"])) for r in rows] == [
        (GEN, 0.125, 400e3), ("-", 0.002, 500e3)]
    store = {r["who"]: r for r in table(text(a), STORE)}
    assert number(store["driver 0 h:1"]["owned"]) == 2.5e6
    assert (store["node n1"]["store used"], number(store["node n1"]["spilled/s"])) == (
        "97.0%", 1e6)


def test_no_ray_ops_no_tables():
    a = Canned({}).answers()
    assert not a.ray and METHODS not in text(a) and STORE not in text(a)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="no ray here")
def test_live_top_shows_the_ray_demo_s_methods_and_owned_bytes():
    from dpobs_otel.demo import report as demo
    from dpobs_otel.demo.batches import Config
    from dpobs_otel.testing.stack import Stack

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("DPOBS_")}
    tm = Tmux()
    try:
        with Stack() as stack:
            cfg = Config(backend="ray", steps=10, batch_size=32, sd_dir=stack.sd_dir,
                         job="raytop")
            with demo.session(cfg, stack):  # returns once Prometheus evaluated the end
                tm.start("prom", [str(Path(sys.executable).with_name("dpobs")), "top",
                                  "--interval", "1", "--prometheus", stack.prometheus], rows=120)
                t = time.time()
                shown = tm.frame_after("prom", t)
                # The processes are idle, yet each rate's extrapolation still moves the
                # per-step ratios from one evaluation to the next (by several % in a short
                # run): the frame's cells are those of an evaluation within a second or two of
                # its stamp (its queries follow the stamp), so every value the rule held then
                # is a candidate.
                at = stamp(re.search(r"· (\d\d:\d\d:\d\d)", shown)[1], t)
                held = _held(stack, at - 1, at + 3)
                owned = {r["metric"]["role"]: r["value"]
                         for r in stack.query(names.INSTANCE_RAY_OWNED_BYTES)}
    finally:
        tm.close()
        os.environ.update(saved)
    assert METHODS in shown and STORE in shown, shown
    rows = {(r["op"], r["method"]): r for r in table(shown, METHODS)}
    assert {(op, m if m != "-" else "") for op, m in rows} == set(held)
    for key, values in held.items():
        cell = number(rows[(key[0], key[1] or "-")]["s/step"])
        # three significant digits, six decimals at most (view.sig)
        assert any(cell == pytest.approx(v, rel=0.006, abs=5e-7) for v in values), (
            key, cell, values)
    assert (names.RAY_RETURN, GEN) in rows and (names.RAY_CALL, ray_plane.UPDATE) in rows
    store = {r["who"].split()[0]: r for r in table(shown, STORE)}
    assert number(store["driver"]["owned"]) == pytest.approx(owned["driver"], rel=0.006)


def _held(stack, start: float, end: float) -> dict:
    """(op, method) -> every value the per-step rule held from start to end."""
    from dpobs_otel.readback.prometheus import Prometheus
    rows = Prometheus(stack.prometheus).query_range(
        names.JOB_OP_METHOD_RAY_SECONDS_PER_STEP, start, end, step=0.1)
    return {(r["metric"]["op"], r["metric"].get("method", "")): {float(v) for _, v in
                                                                  r["values"]}
            for r in rows}


def test_a_ray_process_s_data_time_is_its_data_plane_time_in_the_direct_view():
    """`dpobs top --sd-dir`: a Ray driver that waited 9 s in its gets and spent 0.2 s
    moving data reads 0.2 s of data plane a 10 s step (2%), never the wait; a worker
    without steps adds its data time to the ops, never to the job's numerator."""
    from dpobs_otel.readback.scrape import OpTotals, ProcessTotals
    from dpobs_otel.top import direct
    driver = ProcessTotals(ray_ops={"ray_get": OpTotals(calls=2, seconds=9.2)},
                           ray_data={"ray_get": 0.2}, steps=1, step_seconds=10.0)
    worker = ProcessTotals(ray_ops={"ray_args": OpTotals(calls=2, seconds=0.5)},
                           ray_data={"ray_args": 0.5})
    r = direct.difference(None, driver, 10.0)
    assert r.dp_s / r.step_s == pytest.approx(0.02)  # per second: 0.02 of 1.0
    assert r.seconds == {"ray_get": pytest.approx(0.02)}
    assert r.calls == {"ray_get": pytest.approx(0.2)}
    w = direct.difference(None, worker, 10.0)
    assert w.dp_s == pytest.approx(0.05) and w.step_s == 0
