"""The Ray adapter's op path, in C (_fast.c) and in Python (ops.py, where the extension was not
built), held to the same behaviour without a live Ray: each test runs on both, through
Patches as the adapter builds them, around stand-ins for Ray's functions."""
from __future__ import annotations

import pytest

from dpobs_otel import names
from dpobs_otel.adapters.ray import ops
from dpobs_otel.adapters.ray.locality import Where
from dpobs_otel.adapters.ray.methods import Methods
from dpobs_otel.critical import CriticalPath
from dpobs_otel.shims import ray_private


class Meter:
    def __init__(self):
        self.pending, self.methods, self.drains = [], Methods(), 0
        self.critical, self.where = CriticalPath(), Where(lambda lacking: None)

    def drain(self):
        self.drains += 1
        self.pending.clear()

    def record(self, op, method, dt, keys, nbytes=0, serialization=0.0, error=None,
               owned=None):  # RayMeter.record's: a failed op's way in
        self.pending.append((op, method, dt, keys, nbytes, serialization, error, owned))


class PerProcess:
    def __init__(self, meter):
        self.current = meter


class Serialized:
    total_bytes, metadata = 1000, b"meta"


class Ref:
    def __init__(self, ident: bytes):
        self.ident = ident

    def binary(self) -> bytes:
        return self.ident


class Context:  # Ray's SerializationContext: its serialize is replaced on the class
    def serialize(self, value):  # a program's value becomes a Serialized; any other passes
        return Serialized() if isinstance(value, (str, bytes, int, list)) else value


class Worker:  # Ray's Worker: deserialize_objects, replaced on the class
    def deserialize_objects(self, serialized, refs):
        return [len(data) for data, _ in serialized]


@pytest.fixture(params=["c", "python"])
def patches(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(ops, "FAST", None)
        monkeypatch.setattr(ops, "Frame", ops.PyFrame)
    elif ops.FAST is None:
        pytest.fail("the C op path (_fast.c) was not built: setup.py builds it with a compiler")
    monkeypatch.setattr(Context, "serialize", Context.__dict__["serialize"])
    monkeypatch.setattr(Worker, "deserialize_objects", Worker.__dict__["deserialize_objects"])
    failures = []
    p = ops.Patches(PerProcess(Meter()), failures.append)
    p.failures = failures
    Context.serialize = p.serialize(Context.__dict__["serialize"])
    Worker.deserialize_objects = p.deserialize(Worker.__dict__["deserialize_objects"])
    ops._local.frame = None
    return p


def _put(value):
    Context().serialize(value)
    return Ref(b"object-1")


def _get(refs):
    return Worker().deserialize_objects([(b"x" * 300, b"m"), (b"y" * 20, None)], refs)


def test_a_put_records_its_bytes_its_serialization_and_the_ref(patches):
    put = patches.put(_put)
    ref = put([1, 2, 3])
    assert ref.binary() == b"object-1"
    [(op, method, dt, keys, nbytes, seconds, error, owned)] = patches.per_process.current.pending
    assert (op, method, keys, nbytes, error, owned) == (names.RAY_PUT, None, 1, 1004, None,
                                                        b"object-1")
    assert 0 < seconds <= dt
    assert patches.failures == []


def test_a_get_adds_up_every_object_it_reads(patches):
    values = patches.get(_get)([Ref(b"a"), Ref(b"b")])
    assert values == [300, 20]
    [record] = patches.per_process.current.pending
    assert record[:2] == (names.RAY_GET, None) and record[3:5] == (2, 301 + 20)


def test_the_marker_and_skipped_objects_are_not_the_op_s(patches):
    skipped = "keyword-name"
    call = patches.measured(names.RAY_CALL, lambda *values: [Context().serialize(v)
                                                              for v in values],
                            lambda m, r, dt, frame, a, k: (frame.count, frame.nbytes),
                            skip=frozenset({id(skipped)}))
    call(ray_private.lookup(ray_private.DUMMY), skipped, "an argument")
    assert patches.per_process.current.pending == [(1, 1004)]


def test_the_program_s_error_propagates_as_the_same_object_and_is_counted(patches):
    raised = ValueError("the program's")

    def put(value):
        Context().serialize(value)
        raise raised

    with pytest.raises(ValueError) as caught:
        patches.put(put)("x")
    assert caught.value is raised
    [record] = patches.per_process.current.pending
    assert record[0] == names.RAY_PUT and record[4] == 1004 and record[6] == "ValueError"


def test_an_interrupt_propagates_and_is_counted(patches):
    def put(value):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        patches.put(put)("x")
    assert patches.per_process.current.pending[0][6] == "KeyboardInterrupt"


def test_dpobs_failing_to_read_a_size_is_counted_and_the_op_kept(patches):
    class Odd:  # a serialized object without the size fields dpobs reads
        pass

    ref = patches.put(lambda value: (Context().serialize(Odd()), Ref(b"odd"))[1])("x")
    assert ref.binary() == b"odd"
    assert [type(e) for e in patches.failures] == [AttributeError]
    [record] = patches.per_process.current.pending
    assert record[0] == names.RAY_PUT and record[4] == 0


def test_a_failing_record_maker_is_counted_and_the_result_kept(patches):
    op = patches.measured(names.RAY_WAIT, lambda: "result", lambda *a: 1 / 0)
    assert op() == "result"
    assert [type(e) for e in patches.failures] == [ZeroDivisionError]


def test_outside_an_op_a_worker_s_serialization_is_its_return(patches, monkeypatch):
    returned = []
    monkeypatch.setattr(patches, "_in_worker", lambda: True)
    monkeypatch.setattr(patches, "_returned", lambda s, dt: returned.append((s.total_bytes, dt)))
    Context().serialize("a return value")
    [(size, dt)] = returned
    assert size == 1000 and dt > 0


def test_off_the_op_is_ray_s_own_call(patches):
    patches.per_process.current = None
    assert patches.put(_put)("x").binary() == b"object-1"
    assert patches.failures == []


def test_past_drain_at_the_op_adds_up_the_records(patches, monkeypatch):
    monkeypatch.setattr(ops, "DRAIN_AT", 3)
    put = patches.put(_put)
    for _ in range(7):
        put("x")
    meter = patches.per_process.current
    assert meter.drains == 2 and len(meter.pending) == 1


def test_nested_ops_keep_their_own_frames(patches):
    inner = patches.put(_put)

    def outer_get(refs):
        inner("x")  # a put inside the get (a nested op): its bytes are its own
        return _get(refs)

    patches.get(outer_get)([Ref(b"a")])
    put, get = patches.per_process.current.pending
    assert put[0] == names.RAY_PUT and put[4] == 1004
    assert get[0] == names.RAY_GET and get[4] == 321


def test_an_actor_creation_s_arguments_are_no_op_s_nor_a_return(patches, monkeypatch):
    returned = []
    monkeypatch.setattr(patches, "_in_worker", lambda: True)
    monkeypatch.setattr(patches, "_returned", lambda s, dt: returned.append(s))
    create = patches.unmeasured_call(lambda *values: [Context().serialize(v) for v in values])
    call = patches.measured(names.RAY_CALL, lambda: create("an argument of the actor's"),
                            lambda m, r, dt, frame, a, k: (frame.count, frame.nbytes))
    call()
    assert patches.per_process.current.pending == [(0, 0)] and returned == []


def test_a_serialized_object_of_ray_s_own_is_sized_as_ray_sizes_it(patches):
    from ray._private.serialization import SerializationContext
    context = SerializationContext.__new__(SerializationContext)  # serialize reads no state
    serialize = patches.serialize(SerializationContext.serialize)
    put = patches.measured(names.RAY_PUT, lambda: serialize(context, b"x" * 1000),
                           lambda m, r, dt, frame, a, k: frame.nbytes)
    raw = put()
    assert patches.per_process.current.pending == [raw.total_bytes + len(raw.metadata)]


def test_the_c_clock_is_python_s_perf_counter():
    """A call's start is read in Python (Patches._call) and its end in C: one clock."""
    if ops.FAST is None:
        pytest.fail("the C op path (_fast.c) was not built")
    from time import perf_counter
    before = perf_counter()
    assert before <= ops.FAST.now() <= perf_counter()


class Seen(Where):
    """A Where that answers what a test says: where a get's objects were, and its data part."""
    def __init__(self, data, moved):
        super().__init__(lambda lacking: None)
        self.data, self.moved, self.looked = data, moved, []

    def before(self, refs):
        self.looked.append(refs)
        return "look"

    def after(self, look, dt, nbytes, deserialize_s):
        assert look == "look" and nbytes == 321 and 0 < deserialize_s <= dt
        return self.data, self.moved


def test_a_get_looks_where_its_objects_are_before_ray_s_get_and_records_it(patches):
    meter = patches.per_process.current
    moved = ((names.RAY_REMOTE_LOCALITY, 300, "node-b"), (names.RAY_LOCAL, 21, None))
    meter.where = Seen(0.002, moved)
    refs = [Ref(b"a"), Ref(b"b")]
    assert patches.get(_get)(refs) == [300, 20]
    [record] = meter.pending
    assert meter.where.looked == [refs]
    assert record[8:] == (0.002, moved) and patches.failures == []


def test_without_ray_a_get_s_objects_are_unknown_and_its_data_its_deserialization(patches):
    patches.get(_get)([Ref(b"a")])
    [record] = patches.per_process.current.pending
    assert record[9] == ((names.RAY_UNKNOWN, 321, None),)
    assert 0 < record[8] == record[5]


def test_a_put_in_a_step_is_exposed_and_busy_a_get_its_data_part_only(patches):
    meter = patches.per_process.current
    meter.where = Seen(0.0, ((names.RAY_LOCAL, 321, None),))  # a get that only waited
    cp = meter.critical
    opened = cp.step_begin(ops.perf_counter())
    patches.get(_get)([Ref(b"a")])
    assert cp.totals() == (0.0, 0.0)
    patches.put(_put)("x")
    busy, exposed = cp.totals()
    cp.step_end(opened, ops.perf_counter())
    put = meter.pending[-1]
    assert 0 < busy <= put[2] and 0 < exposed <= put[2]
