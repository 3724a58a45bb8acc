"""The Ray adapter's account without a cluster: bounded method labels and the refs each call
returned, the `method` attribute through dispatchers, Ray's own processes told apart, and
Ray's ops kept beside the data plane's (their own step_metrics keys, the core's op series,
never frac_of_step, busy, exposed or occupancy; the readers keep them apart too)."""
from __future__ import annotations

import urllib.request

import pytest

import dpobs_otel as dpobs
from dpobs_otel import names
from dpobs_otel.adapters.ray.instrumentor import _ray_own_process
from dpobs_otel.adapters.ray.meter import RayMeter
from dpobs_otel.adapters.ray.methods import MIXED, OTHER, Methods, carried, internal
from dpobs_otel.readback import scrape
from helpers import scrape as scrape_tel
from helpers import value


class Ref:
    """What the adapter reads of an ObjectRef: its binary id."""

    def __init__(self, n: int):
        self._id = n.to_bytes(28, "big")

    def binary(self) -> bytes:
        return self._id


def test_labels_stay_bounded():
    m = Methods(max_names=3)
    assert [m.label("A", f"m{i}") for i in range(5)] == ["A.m0", "A.m1", "A.m2", OTHER, OTHER]
    assert m.label("A", "m1") == "A.m1"  # a known name stays itself past the bound
    assert m.label("", "task") == OTHER


def test_gets_are_attributed_to_the_call_that_returned_their_refs():
    m = Methods(max_refs=4)
    m.returned(Ref(1), "A.f")
    m.returned([Ref(2), Ref(3)], "B.g")
    assert m.of([Ref(1)]) == "A.f"
    assert m.of([Ref(2), Ref(3)]) == "B.g"
    assert m.of([Ref(1), Ref(2)]) == MIXED
    assert m.of([Ref(99)]) is None  # a ref no call of this process returned
    assert m.of([Ref(1), Ref(99)]) == MIXED
    m.returned([Ref(4), Ref(5)], "C.h")  # past max_refs the oldest are forgotten
    assert m.of([Ref(1)]) is None and m.of([Ref(5)]) == "C.h"


def test_dispatchers_are_named_for_the_method_they_carry():
    def update_actor():
        pass
    assert carried("_fuw_execute", ("actor_rollout_generate_sequences", 1)) == \
        "actor_rollout_generate_sequences"
    assert carried("__ray_call__", (update_actor,)) == "update_actor"
    assert carried("score", ("not carried",)) == "score"
    assert internal("__ray_ready__") and internal("__ray_terminate__")
    assert not internal("__ray_call__") and not internal("score")


@pytest.mark.parametrize("argv0,own", [
    ("/venv/lib/python3.11/site-packages/ray/dashboard/dashboard.py", True),
    ("/venv/lib/python3.11/site-packages/ray/dashboard/agent.py", True),
    ("/venv/lib/python3.11/site-packages/ray/_private/log_monitor.py", True),
    ("/venv/lib/python3.11/site-packages/ray/_private/workers/default_worker.py", False),
    ("/home/me/train.py", False),
    ("", False)])
def test_ray_s_own_processes_are_told_from_drivers_and_workers(argv0, own):
    assert _ray_own_process(argv0, "/venv/lib/python3.11/site-packages/ray") is own


@pytest.fixture
def tel():
    t = dpobs.start(role="ray-account", rank=0, job="ray-account", port=0)
    yield t
    t.shutdown()


def _ops(meter):
    meter.record(names.RAY_PUT, None, 0.004, 1, 5000, 0.001, owned=bytes.fromhex("00ff"))
    meter.record(names.RAY_CALL, "A.f", 0.001, 2, 300, 0.0002)
    meter.record(names.RAY_GET, "A.f", 2.0, 3, 7000, 0.003)
    meter.record(names.RAY_GET, "A.f", 0.5, 1, 0, 0.0, error="GetTimeoutError")


def test_ray_ops_data_part_is_data_plane_time_and_their_whole_duration_is_not(tel):
    meter = RayMeter(tel)
    with tel.step():
        _ops(meter)
    m = tel.step_metrics()
    # put 0.004 and call 0.001 whole; a get whose data part was not told: its
    # deserialization (0.003); the get that timed out moved nothing
    assert m["dpobs/data_plane_s"] == pytest.approx(0.008)
    assert m["dpobs/frac_of_step"] == pytest.approx(0.008 / m["dpobs/step_s"])
    assert m["dpobs/ray/ray_get/data_s"] == pytest.approx(0.003)
    assert m["dpobs/ray/ray_put/share"] == pytest.approx(0.5)
    assert not any(k.startswith("dpobs/op/") for k in m)
    assert m["dpobs/ray/ray_get/calls"] == 2 and m["dpobs/ray/ray_get/errors"] == 1
    assert m["dpobs/ray/ray_get/seconds"] == pytest.approx(2.5)
    assert m["dpobs/ray/ray_get/mb"] == pytest.approx(0.007)
    assert m["dpobs/ray/ray_put/serialization_s"] == pytest.approx(0.001)
    assert m["dpobs/ray/owned_mb"] == pytest.approx(0.005)
    assert m["dpobs/ray/instrumentation_s"] > 0 and m["dpobs/instrumentation_s"] == 0
    again = tel.step_metrics()  # a window: what happened since the last call
    assert again["dpobs/ray/ray_get/calls"] == 0 and again["dpobs/ray/owned_mb"] > 0


def test_data_seconds_bytes_by_locality_remote_bytes_and_the_node_are_exported(tel):
    meter = RayMeter(tel)
    meter.where.node = "a" * 56  # as Ray would tell it once connected
    remote = names.RAY_REMOTE_LOCALITY
    meter.record(names.RAY_GET, "A.f", 2.0, 2, 7000, 0.003, data=0.25,
                 moved=((names.RAY_LOCAL, 1000, None), (remote, 6000, "b" * 56)))
    meter.record(names.RAY_GET, "A.f", 0.1, 1, 500, 0.001, data=0.1,
                 moved=((names.RAY_LOCAL, 500, None),))
    meter.record(names.RAY_PUT, None, 0.004, 1, 5000, 0.001)
    s = scrape_tel(tel)
    moved, data = names.RAY_MOVED_SERIES, names.RAY_DATA_SERIES
    assert value(s, moved, op="ray_get", method="A.f", locality="local") == 1500
    assert value(s, moved, op="ray_get", method="A.f", locality="remote") == 6000
    assert value(s, moved, op="ray_put", locality="local") == 5000
    assert value(s, names.RAY_REMOTE_SERIES, op="ray_get", from_node="b" * 56) == 6000
    assert value(s, data, op="ray_get", method="A.f") == pytest.approx(0.35)
    assert value(s, data, op="ray_put") == pytest.approx(0.004)
    fetch = names.RAY_FETCH_SERIES
    assert value(s, fetch + "_count", op="ray_get", locality="mixed") == 1
    assert value(s, fetch + "_sum", op="ray_get", locality="local") == pytest.approx(0.1)
    assert value(s, names.RAY_NODE_SERIES, ray_node="a" * 56) == 1


def test_remote_bytes_past_the_node_limit_name_other(tel):
    meter = RayMeter(tel)
    for i in range(names.RAY_FROM_NODE_LIMIT + 3):
        meter.record(names.RAY_GET, None, 0.01, 1, 10, 0.001, data=0.01,
                     moved=((names.RAY_REMOTE_LOCALITY, 10, f"{i:056x}"),))
    s = scrape_tel(tel)
    assert value(s, names.RAY_REMOTE_SERIES, op="ray_get", from_node="other") == 30
    assert value(s, names.RAY_REMOTE_SERIES, op="ray_get", from_node=f"{0:056x}") == 10


def test_ray_ops_join_the_core_series_with_their_method(tel):
    _ops(RayMeter(tel))
    s = scrape_tel(tel)
    op = names.OP_DURATION_SERIES
    assert value(s, op + "_count", op="ray_get", method="A.f") == 2
    # A put has no method: the exporter writes the label empty beside the family's others (an
    # older one, the floor's 0.59b0, leaves it out); PromQL, and value(), read both as absent.
    assert value(s, op + "_count", op="ray_put") == 1
    assert value(s, names.KEYS_SERIES, op="ray_get", method="A.f") == 4
    assert value(s, names.TRANSFERRED_SERIES, op="ray_call", method="A.f",
                 direction="write") == 300
    assert value(s, names.OP_ERRORS_SERIES, op="ray_get", method="A.f",
                 error_type="GetTimeoutError") == 1
    assert value(s, names.RAY_SERIALIZATION_SERIES + "_sum", op="ray_get",
                 direction="deserialize") == pytest.approx(0.003)
    assert value(s, names.RAY_OWNED_SERIES) == 5000  # no Ray here: nothing to drop
    assert value(s, names.OUTSTANDING_SIZE_SERIES) == 0
    assert value(s, names.INSTR_TIME_SERIES, component="ray") > 0


def test_the_readers_keep_ray_ops_apart(tel):
    _ops(RayMeter(tel))
    with tel.step():
        pass
    body = urllib.request.urlopen(f"http://{tel.endpoint}/metrics", timeout=10).read().decode()
    totals = scrape.parse(body)
    assert set(totals.ops) == set()
    assert set(totals.ray_ops) == {"ray_put", "ray_call", "ray_get"}
    assert totals.ray_ops["ray_get"].calls == 2 and totals.ray_ops["ray_get"].keys == 4
    assert totals.ray_ops["ray_get"].read_bytes == 7000


def test_every_record_is_added_up_once_whatever_thread_recorded_or_collected_it(tel):
    """Records wait in `pending` until the meter's thread, a collection or a window adds
    them up: eight threads recording while another reads windows (step_metrics' one
    caller) lose none and count none twice."""
    import threading
    meter, stop, seen = RayMeter(tel), threading.Event(), []

    def reader():
        while not stop.is_set():
            seen.append(meter.window().get("dpobs/ray/ray_get/calls", 0))

    def writer(n):
        for i in range(3000):
            meter.record(names.RAY_GET, f"M.m{n}", 0.001, 2, 10)

    readers = [threading.Thread(target=reader)]
    writers = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    seen.append(meter.window()["dpobs/ray/ray_get/calls"])
    assert sum(seen) == 8 * 3000 and not meter.pending
    s = scrape_tel(tel)
    for n in range(8):
        assert value(s, names.KEYS_SERIES, op="ray_get", method=f"M.m{n}") == 6000
        assert value(s, names.OP_DURATION_SERIES + "_count", op="ray_get",
                     method=f"M.m{n}") == 3000


def test_the_meter_s_thread_adds_up_what_nothing_collects(tel):
    import threading
    import time

    def threads():
        return sum(t.name == "dpobs-ray-account" for t in threading.enumerate())

    before = threads()
    meter = RayMeter(tel)
    assert threads() == before + 1
    for _ in range(1000):  # fewer than DRAIN_AT: no op adds them up itself
        meter.record(names.RAY_GET, None, 0.001, 1)
    deadline = time.monotonic() + 10
    while meter.pending and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not meter.pending and meter._ops[(names.RAY_GET, None)].calls == 1000


def test_owned_bytes_forget_what_the_process_no_longer_references(tel, monkeypatch):
    from dpobs_otel.adapters.ray import meter as ray_meter
    from dpobs_otel.shims import ray_private
    live = {f"{i:04x}" for i in range(10)}  # what Ray's reference table still holds
    monkeypatch.setattr(ray_private, "referenced", lambda: live)
    monkeypatch.setattr(ray_meter, "PRUNE_EVERY", 16)
    monkeypatch.setattr(ray_meter, "DRAIN_AT", 4)
    m = RayMeter(tel)
    for i in range(40):  # never scraped: the records are added up and the map pruned as
        m.record(names.RAY_PUT, None, 0.001, 1, 100, owned=bytes.fromhex(f"{i:04x}"))
        assert len(m.pending) < 4 and len(m._owned) < 32  # they grow
    assert len(m._owned) >= 10
    assert value(scrape_tel(tel), names.RAY_OWNED_SERIES) == 10 * 100


class _Ref:
    def __init__(self, ident: bytes):
        self.ident = ident

    def binary(self) -> bytes:
        return self.ident


def _where(monkeypatch, lacking=(), table=None):
    from dpobs_otel.adapters.ray import locality
    from dpobs_otel.shims import ray_private
    said = []
    monkeypatch.setattr(ray_private, "connected", lambda: True)
    monkeypatch.setattr(ray_private, "locality_missing", lambda: list(lacking))
    monkeypatch.setattr(ray_private, "locations_reader",
                        lambda: lambda refs: {r: table[r.ident] for r in refs
                                              if r.ident in (table or {})})
    monkeypatch.setattr(ray_private, "ref_type", lambda: _Ref)
    monkeypatch.setattr(ray_private, "node_id", lambda: "A")
    where = locality.Where(said.append)
    where.places([])
    return where, said


def test_each_object_s_locality_from_ray_s_location_table(monkeypatch):
    where, said = _where(monkeypatch)
    L, R, S, U = (names.RAY_LOCAL, names.RAY_REMOTE_LOCALITY, names.RAY_SPILLED,
                  names.RAY_UNKNOWN)

    def place(nodes, size, spilled=False, ref=_Ref(b"o")):
        return where.place(ref, {"node_ids": nodes, "object_size": size,
                                 "did_spill": spilled})
    assert place(["A", "B"], 10) == (L, 10, None)  # a copy here
    assert place(["B", "C"], 10) == (R, 10, "B")  # pulled from the first Ray lists
    assert place([], 10, spilled=True) == (S, 10, None)
    assert place(["A"], 10, spilled=True, ref=_Ref(b"s")) == (S, 10, None)  # on disk here
    where._pull(_Ref(b"s"))  # restored by this process: did_spill stays, the copy is here
    assert place(["A"], 10, spilled=True, ref=_Ref(b"s")) == (L, 10, None)
    assert place([], 10) == (L, 10, None)  # in the process's own memory store
    assert place([], None) == (U, 0, None)  # the id alone: a worker's argument by ref
    assert where.place(_Ref(b"o"), None) == (U, 0, None)  # the lookup failed
    where._pull(_Ref(b"o"))  # this process pulled it: its borrowed entry says B still
    assert place(["B"], 10) == (L, 10, None)
    assert said == []


def test_a_get_s_bytes_split_by_where_each_object_was():
    from dpobs_otel.adapters.ray.locality import fetch_locality, split
    L, R = names.RAY_LOCAL, names.RAY_REMOTE_LOCALITY
    assert split([(R, 7, "B"), (R, 5, "B")], 12) == ((R, 12, "B"),)
    moved = split([(L, 3, None), (R, 5, "B"), (R, 2, "C")], 10)
    assert moved == ((L, 3, None), (R, 5, "B"), (R, 2, "C"))
    assert fetch_locality(moved) == names.RAY_MIXED and fetch_locality(moved[1:]) == R


def test_a_ray_without_the_location_table_is_unknown_said_once(monkeypatch):
    from dpobs_otel.shims.ray_private import LOCALITY_NAMES
    made = {b"o": {"node_ids": ["B"], "object_size": 100, "did_spill": False}}
    where, said = _where(monkeypatch, lacking=[LOCALITY_NAMES[0]], table=made)
    look = where.before(_Ref(b"o"))
    assert where.after(look, 0.5, 100, 0.01) == (0.01, ((names.RAY_UNKNOWN, 100, None),))
    where.before([_Ref(b"p")])
    assert said == [[LOCALITY_NAMES[0]]]


def test_a_ray_without_on_ready_places_what_exists_and_not_what_is_not_made(monkeypatch):
    """Ray before 2.60 (no ObjectRef._on_ready): an object that existed when the get began
    is placed and its get is all data time, as on 2.60; one not made yet is unknown, and its
    get's data time is the deserialization (when it came to exist cannot be told)."""
    from dpobs_otel.shims.ray_private import LOCALITY_NAMES
    made = {b"o": {"node_ids": ["B"], "object_size": 100, "did_spill": False},
            b"p": {"node_ids": [], "object_size": None, "did_spill": False}}
    where, said = _where(monkeypatch, lacking=[LOCALITY_NAMES[1]], table=made)
    look = where.before(_Ref(b"o"))
    assert where.after(look, 0.5, 100, 0.01) == (0.5, ((names.RAY_REMOTE_LOCALITY, 100, "B"),))
    look = where.before([_Ref(b"p")])
    assert look.cancels == []  # nothing asked of Ray's (absent) callback
    assert where.after(look, 0.5, 40, 0.01) == (0.01, ((names.RAY_UNKNOWN, 40, None),))
    look = where.before([_Ref(b"p"), _Ref(b"o")])  # a list holding one of each
    data, moved = where.after(look, 0.5, 140, 0.01)
    assert data == 0.01 and sorted(m[0] for m in moved) == sorted(
        [names.RAY_LOCAL, names.RAY_UNKNOWN])  # o pulled by the first get: local now
    assert said == [[LOCALITY_NAMES[1]]]


def test_a_get_that_waited_counts_from_its_last_object_s_existence(monkeypatch):
    from dpobs_otel.adapters.ray import locality
    from dpobs_otel.shims import ray_private
    where, _ = _where(monkeypatch)
    ready = []
    monkeypatch.setattr(ray_private, "on_ready", lambda ref, cb: ready.append(cb) or (
        lambda: None))
    pending = {"node_ids": [], "object_size": None, "did_spill": False}
    made = {"node_ids": ["A", "B"], "object_size": 100, "did_spill": False}
    ref = _Ref(b"w")
    where._read = lambda refs: {ref: made if ready else pending}  # made once noted
    look = where.before(ref)
    assert look.places == [None] and len(ready) == 1
    look.start -= 2.0  # the get began 2 s ago; its object came to exist just now
    ready[0](None)
    data, moved = where.after(look, 2.0, 100, 0.001)
    assert 0.001 <= data < 0.5  # the tail, not the 2 s wait
    assert moved == ((names.RAY_REMOTE_LOCALITY, 100, "B"),)  # made on B, brought here
    assert locality.Where.cancel(look) is None
