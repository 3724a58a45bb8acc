"""The ring: what is kept (sampling per step, ops on threads without a step, asyncio tasks),
its bound, the wall clock it is read in, and /trace's handler called with a WSGI environ."""
from __future__ import annotations

import asyncio
import gzip
import json
import threading
import time
from time import perf_counter

from dpobs_otel.tracing import Tracer
from dpobs_otel.tracing.route import trace_handler
from dpobs_otel.tracing.tracer import last_steps


def _step(tr: Tracer, ops=("get",)):
    h = tr.step_begin()
    t0 = perf_counter()
    for op in ops:
        a = perf_counter()
        tr.op(op, a, perf_counter(), "p", 2, 10)
    tr.step_end(h, t0, perf_counter())


def _names(tr: Tracer, **kw):
    return [(s["name"], s["attributes"].get("step")) for s in tr.snapshot(**kw)["spans"]]


def test_every_step_and_its_ops_are_kept_with_their_attributes():
    tr = Tracer(100, 1, {"role": "trainer"})
    _step(tr, ("put", "get"))
    _step(tr, ("get",))
    assert _names(tr) == [("dpobs.put", 1), ("dpobs.get", 1), ("dpobs.step", 1),
                          ("dpobs.get", 2), ("dpobs.step", 2)]
    op = tr.snapshot()["spans"][0]
    assert op["attributes"] == {"step": 1, "op": "put", "partition": "p", "keys": 2,
                                "bytes": 10}
    assert op["tid"] == threading.get_ident()
    assert tr.snapshot()["threads"][str(threading.get_ident())] == "MainThread"


def test_one_step_in_n_is_sampled_and_the_others_keep_nothing():
    tr = Tracer(100, 3)
    for _ in range(7):
        _step(tr)
    assert [n for name, n in _names(tr) if name == "dpobs.step"] == [1, 4, 7]
    assert [n for name, n in _names(tr) if name == "dpobs.get"] == [1, 4, 7]


def test_an_op_on_a_thread_without_a_step_follows_the_process_step_open_then():
    tr = Tracer(100, 2)

    def worker():
        t = perf_counter()
        tr.op("get", t, t + 1e-6, "p", 1, 1)

    for _ in range(4):  # steps 1 and 3 are sampled: the worker's op is kept in those
        h = tr.step_begin()
        th = threading.Thread(target=worker)
        th.start()
        th.join()
        tr.step_end(h, perf_counter(), perf_counter())
    assert [n for name, n in _names(tr) if name == "dpobs.get"] == [1, 3]
    worker()  # no step open anywhere, one step in 2 traced: not kept
    assert len(_names(tr)) == 4


def test_outside_any_step_ops_are_kept_when_every_step_is_traced():
    tr = Tracer(100, 1)
    t = perf_counter()
    tr.op("register", t, t, None, 0, 0)
    tr.wait(t, t)  # a wait outside a step counts nothing
    assert _names(tr) == [("dpobs.register", None)]


def test_asyncio_tasks_inherit_the_step_of_the_task_that_opened_it():
    tr = Tracer(100, 2)

    async def op():
        t = perf_counter()
        await asyncio.sleep(0)
        tr.op("get", t, perf_counter(), "p", 1, 1)

    async def main():
        for _ in range(2):  # step 1 sampled, step 2 not
            h = tr.step_begin()
            await asyncio.gather(op(), op())
            tr.step_end(h, perf_counter(), perf_counter())

    asyncio.run(main())
    assert sorted(_names(tr)) == [("dpobs.get", 1), ("dpobs.get", 1), ("dpobs.step", 1)]


def test_the_ring_is_bounded_and_says_how_many_it_dropped():
    tr = Tracer(10, 1)
    for _ in range(25):
        _step(tr)  # two spans each
    snap = tr.snapshot()
    assert len(snap["spans"]) == 10 and snap["ring"] == {"size": 10, "every": 1,
                                                         "dropped": 40}
    assert snap["spans"][-1]["attributes"]["step"] == 25


def test_times_are_the_callers_clock_read_as_wall_clock():
    tr = Tracer(10, 1)
    t0 = perf_counter()
    tr.op("get", t0, t0 + 0.25, "p", 1, 1)
    now = time.time_ns()
    s = tr.snapshot()["spans"][0]
    assert abs((s["end_ns"] - s["start_ns"]) - 250_000_000) <= 1_000
    assert abs(s["start_ns"] - now) < 50_000_000  # t0 was a moment ago


def test_a_wait_is_kept_in_its_step():
    tr = Tracer(10, 1)
    h = tr.step_begin()
    t = perf_counter()
    tr.wait(t, t + 0.001, "exposed")
    tr.step_end(h, t, t + 0.002)
    assert _names(tr) == [("dpobs.wait", 1), ("dpobs.step", 1)]
    assert tr.snapshot()["spans"][0]["attributes"]["wait"] == "exposed"


def test_last_steps_keeps_what_ends_after_the_nth_last_step_starts():
    tr = Tracer(100, 1)
    for _ in range(5):
        _step(tr)
    assert {n for _, n in _names(tr, steps=2)} == {4, 5}
    assert last_steps([], 3) == [] and last_steps(tr.snapshot()["spans"], 0) == []


def _get(handler, query="", method="GET", encoding=""):
    return handler({"REQUEST_METHOD": method, "PATH_INFO": "/trace", "QUERY_STRING": query,
                    "HTTP_ACCEPT_ENCODING": encoding})


def test_the_trace_handler_serves_the_ring_as_json():
    tr = Tracer(100, 1, {"role": "rollout", "rank": 0})
    for _ in range(3):
        _step(tr)
    handler = trace_handler(tr)
    status, headers, body = _get(handler)
    assert status == "200 OK" and ("Content-Type", "application/json") in headers
    doc = json.loads(body)
    assert doc["format"] == "dpobs-trace/1" and doc["resource"]["role"] == "rollout"
    assert len(doc["spans"]) == 6
    status, headers, body = _get(handler, "steps=1", encoding="gzip")
    assert ("Content-Encoding", "gzip") in headers
    assert {s["attributes"]["step"] for s in json.loads(gzip.decompress(body))["spans"]} == {3}


def test_the_trace_handler_refuses_what_it_cannot_answer():
    errors = []
    broken = Tracer(1, 1)
    broken.snapshot = lambda steps: 1 / 0
    assert _get(trace_handler(Tracer(1, 1)), method="POST")[0].startswith("405")
    assert _get(trace_handler(Tracer(1, 1)), "steps=x")[0].startswith("400")
    status = _get(trace_handler(broken, lambda c, e: errors.append(c)))[0]
    assert status.startswith("500") and errors == ["trace"]


def test_overlapping_ops_of_one_thread_get_tracks_of_their_own():
    from dpobs_otel.tracing.events import Process, chrome_trace

    def sp(kind, start, end, tid=1, **attrs):
        return {"kind": kind, "name": "x", "start_ns": start, "end_ns": end, "tid": tid,
                "attributes": {"op": "get", "step": 1, **attrs}}

    # a step; inside it two gathered gets overlap without nesting, then one nested get;
    # another thread's op
    spans = [sp("step", 0, 100), sp("op", 10, 50), sp("op", 20, 60), sp("op", 70, 80),
             sp("op", 30, 40, tid=2)]
    doc = chrome_trace([Process("p", {}, {1: "MainThread", 2: "pool"}, spans)])
    names = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["name"] == "thread_name"}
    assert names == {1: "MainThread", 2: "MainThread (overlapping 1)", 3: "pool"}
    xs = [(e["tid"], e["ts"], e["dur"]) for e in doc["traceEvents"] if e["ph"] == "X"]
    assert xs == [(1, 0.0, 0.1), (1, 0.01, 0.04), (1, 0.07, 0.01), (2, 0.02, 0.04),
                  (3, 0.03, 0.01)]
    for tid in (1, 2, 3):  # on every track, each event nests in or follows the ones before
        open_ends = []
        for t, ts, dur in (x for x in xs if x[0] == tid):
            open_ends = [e for e in open_ends if e > ts]
            assert all(ts + dur <= e for e in open_ends)
            open_ends.append(ts + dur)
