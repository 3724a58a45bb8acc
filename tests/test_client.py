import random
import sys
import threading
import time
import traceback

import msgpack
import pytest
import torch
from helpers import scrape, value
from tensordict import NonTensorData, TensorDict

import dpobs_otel as dpobs
import dpobs_otel.client as client_mod

OPS = "dpobs_client_operation_duration_seconds_count"
BYTES = "dpobs_client_transferred_bytes_total"
KEYS = "dpobs_client_keys_total"


def _batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (n,), generator=g).tolist()
    td = TensorDict({
        "tok": torch.nested.nested_tensor([torch.randint(0, 100, (k,), generator=g)
                                           for k in lengths], layout=torch.jagged),
        "adv": torch.randn(n, 3, generator=g).to(torch.bfloat16),
        "mask": torch.rand(n, 7, generator=g) > 0.5,
    }, batch_size=[n])
    td["meta"] = NonTensorData({"seed": seed, "note": "ünï"})
    truth = (sum(lengths) * 8 + n * 3 * 2 + n * 7 * 1
             + len(msgpack.packb({"seed": seed, "note": "ünï"})))
    return td, truth


def test_scripted_workload_matches_independent_truth(tel, client):
    rng = random.Random(0)
    truth = {"put": 0, "get": 0, "keys_put": 0, "keys_get": 0, "calls": {}}
    live, live_bytes = {}, 0.0
    for step in range(12):
        n = rng.randint(1, 16)
        ids = [f"s{step}-{i}" for i in range(n)]
        td, nbytes = _batch(n, step)
        with tel.step():
            client.put_samples(ids, "train", td)
            shard = ids[: rng.randint(1, n)]
            got = client.get_samples(shard, "train", ["tok", "adv"])
            client.list_sample_ids("train")
        truth["put"] += nbytes
        truth["keys_put"] += n
        truth["keys_get"] += len(shard)
        truth["get"] += sum(t.contiguous().nbytes if not t.is_nested else t.values().nbytes
                            for t in (got["tok"], got["adv"]))
        live.update(dict.fromkeys(ids)); live_bytes += nbytes
    s = scrape(tel)
    assert value(s, OPS, op="put") == 12 and value(s, OPS, op="get") == 12
    assert value(s, BYTES, op="put", direction="write") == truth["put"]
    assert value(s, BYTES, op="get", direction="read") == truth["get"]
    assert value(s, KEYS, op="put") == truth["keys_put"]
    assert value(s, KEYS, op="get") == truth["keys_get"]
    assert value(s, "dpobs_client_outstanding_keys") == len(live)
    assert value(s, "dpobs_client_outstanding_size_bytes") == pytest.approx(live_bytes, abs=1)
    assert value(s, "dpobs_step_duration_seconds_count") == 12
    # Clearing everything, in uneven pieces, returns occupancy exactly to zero.
    ids = list(live)
    for lo in range(0, len(ids), 7):
        client.clear_samples(ids[lo:lo + 7], "train")
    s = scrape(tel)
    assert value(s, "dpobs_client_outstanding_keys") == 0
    assert value(s, "dpobs_client_outstanding_size_bytes") == 0
    assert value(s, KEYS, op="clear") == len(ids)


def test_partial_clear_releases_pro_rata(tel, client):
    td, nbytes = _batch(10, 1)
    client.put_samples([str(i) for i in range(10)], "p", td)
    client.clear_samples(["0", "1", "2", "3"], "p")
    s = scrape(tel)
    assert value(s, "dpobs_client_outstanding_size_bytes") == round(nbytes * 6 / 10)
    client.clear_samples(None, "p")
    assert value(scrape(tel), "dpobs_client_outstanding_size_bytes") == 0


def test_inner_exception_propagates_unchanged_and_is_counted(tel, client):
    with pytest.raises(KeyError) as info:
        client.get_samples(["nope"], "missing-partition")
    direct = dpobs.InMemoryDataPlane()
    with pytest.raises(KeyError) as bare:
        direct.get_samples(["nope"], "missing-partition")
    assert str(info.value) == str(bare.value)
    # The traceback still ends inside the store, not in our wrapper.
    assert traceback.extract_tb(info.tb)[-1].filename.endswith("memory.py")
    s = scrape(tel)
    assert value(s, "dpobs_client_operation_errors_total", op="get", error_type="KeyError") == 1
    assert value(s, OPS, op="get") == 1  # duration includes the failed call


def test_same_exception_object_reaches_the_caller(tel):
    boom = RuntimeError("store down")

    class Failing:
        def put_samples(self, *a, **k):
            raise boom
    with pytest.raises(RuntimeError) as info:
        tel.instrument(Failing()).put_samples(["a"], "p", None)
    assert info.value is boom
    s = scrape(tel)
    assert value(s, "dpobs_client_operation_errors_total", op="put",
                 error_type="RuntimeError") == 1


def test_sizing_failure_keeps_the_op_timed_and_counted(tel, client, monkeypatch):
    def broken(_):
        raise ZeroDivisionError("bug in dpobs")
    monkeypatch.setattr(client_mod, "field_nbytes", broken, raising=False)
    monkeypatch.setattr(client_mod, "payload_nbytes", broken)
    td, _ = _batch(3, 2)
    with tel.step():
        client.put_samples(["a", "b", "c"], "p", td)
        out = client.get_samples(["a"], "p")
    assert out.batch_size == torch.Size([1])
    s = scrape(tel)
    assert value(s, "dpobs_instrumentation_errors_total", component="sizing") == 2
    assert ("dpobs_client_operation_errors_total", frozenset({("op", "put"),
            ("error_type", "ZeroDivisionError")})) not in s
    # Everything but the bytes is intact: the calls are timed, counted, their keys named.
    assert value(s, OPS, op="put") == 1 and value(s, OPS, op="get") == 1
    assert value(s, "dpobs_client_operation_duration_seconds_sum", op="put") > 0
    assert value(s, KEYS, op="put") == 3 and value(s, KEYS, op="get") == 1
    assert value(s, "dpobs_client_outstanding_keys") == 3
    m = tel.step_metrics()
    assert m["dpobs/op/put/calls"] == 1 and m["dpobs/op/get/calls"] == 1
    assert m["dpobs/data_plane_s"] > 0


def test_unsizable_nontensor_payload_still_counts_the_op(tel, client):
    from tensordict import NonTensorData
    td = TensorDict({"x": torch.ones(3, 2)}, batch_size=[3])
    td["meta"] = NonTensorData([[0]] * 3000)  # once a ZeroDivisionError in the sizing walk
    client.put_samples(["a", "b", "c"], "p", td)
    s = scrape(tel)
    assert value(s, OPS, op="put") == 1
    assert value(s, BYTES, op="put", direction="write") == 24 + len(msgpack.packb([[0]] * 3000))


def test_rows_a_store_silently_drops_are_counted_missing(tel):
    class Dropping(dpobs.InMemoryDataPlane):
        def get_samples(self, ids, pid, select=None):
            return super().get_samples([i for i in ids if i in self.list_sample_ids(pid)],
                                       pid, select)
    c = tel.instrument(Dropping())
    td, _ = _batch(2, 3)
    c.put_samples(["a", "b"], "p", td)
    assert len(c.get_samples(["a", "b", "ghost"], "p")) == 2
    assert value(scrape(tel), "dpobs_client_rows_missing_total", op="get") == 1


def test_other_attributes_pass_through(client):
    assert client.latency_s == 0.0
    assert client.get_tags(["x"], "p") == [None]


def test_reconcile_drops_keys_another_process_cleared(tel):
    store = dpobs.InMemoryDataPlane()
    writer = tel.instrument(store)
    writer._acct.reconcile_rows = 8
    td, _ = _batch(4, 4)
    writer.put_samples(["a", "b", "c", "d"], "p", td)
    store.clear_samples(["a", "b"], "p")  # "another process": not through this client
    writer.put_samples(["e", "f", "g", "h"], "p", _batch(4, 5)[0])  # crosses the throttle
    assert value(scrape(tel), "dpobs_client_outstanding_keys") == 6


def test_failing_listing_is_skipped_not_raised(tel):
    class NoList(dpobs.InMemoryDataPlane):
        def list_sample_ids(self, pid):
            raise ConnectionError("listing unavailable")
    c = tel.instrument(NoList())
    c._acct.reconcile_rows = 1
    c.put_samples(["a"], "p", _batch(1, 6)[0])  # must not raise
    s = scrape(tel)
    assert value(s, "dpobs_client_outstanding_keys") == 1
    assert value(s, "dpobs_instrumentation_errors_total", component="reconcile") == 1


def test_threads_and_concurrent_scrapes_keep_every_counter_exact(tel):
    c = tel.instrument(dpobs.InMemoryDataPlane())
    td = TensorDict({"x": torch.ones(2, 4)}, batch_size=[2])
    n_threads, n_ops = 8, 2000
    errors = []

    def work(k):
        try:
            for i in range(n_ops // 2):
                ids = [f"{k}-{i}-0", f"{k}-{i}-1"]
                c.put_samples(ids, "p", td)
                c.get_samples(ids[:1], "p")
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    scrapes = []

    def scraper():
        for _ in range(200):
            scrapes.append(value(scrape(tel), OPS, op="put"))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
    threads.append(threading.Thread(target=scraper))
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: races show up if there are any
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors
    s = scrape(tel)
    per = n_threads * n_ops // 2
    assert value(s, OPS, op="put") == per and value(s, OPS, op="get") == per
    assert value(s, KEYS, op="put") == 2 * per and value(s, KEYS, op="get") == per
    assert value(s, BYTES, op="put", direction="write") == per * 32
    assert value(s, BYTES, op="get", direction="read") == per * 16
    assert value(s, "dpobs_client_outstanding_keys") == 2 * per
    assert len(scrapes) == 200 and scrapes == sorted(scrapes)  # monotonic while it ran


# -- property: whatever the payload, the wrapper never raises where the store does not ----
from hypothesis import HealthCheck, given, settings  # noqa: E402
from helpers.payloads import payloads  # noqa: E402


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads())
def test_random_payloads_never_make_the_wrapper_raise(tel, payload):
    td, truth, exact = payload
    store = dpobs.InMemoryDataPlane()
    c = tel.instrument(store)
    ids = [f"r{i}" for i in range(td.batch_size[0])]
    before = tel.stats.instr_errors.get("client", 0)
    written_before = tel.stats.ops.get("put").write_bytes if "put" in tel.stats.ops else 0
    c.put_samples(ids, "p", td)
    c.get_samples(ids, "p")
    c.clear_samples(ids, "p")
    assert tel.stats.instr_errors.get("client", 0) == before
    if exact:
        assert tel.stats.ops["put"].write_bytes - written_before == truth


def test_overwriting_live_ids_replaces_their_bytes(tel, client):
    td, nbytes = _batch(4, 7)
    ids = ["a", "b", "c", "d"]
    client.put_samples(ids, "p", td)
    client.put_samples(ids, "p", td)  # the store replaces the rows: nothing more is held
    s = scrape(tel)
    assert value(s, "dpobs_client_outstanding_size_bytes") == nbytes
    assert value(s, "dpobs_client_outstanding_keys") == 4
    client.put_samples(["c", "d", "e", "f"], "p", _batch(4, 7)[0])  # half overlap, same rows
    s = scrape(tel)
    assert value(s, "dpobs_client_outstanding_keys") == 6
    assert value(s, "dpobs_client_outstanding_size_bytes") == pytest.approx(nbytes * 6 / 4, abs=1)
    client.clear_samples(None, "p")
    assert value(scrape(tel), "dpobs_client_outstanding_size_bytes") == 0


def test_delta_write_adds_only_the_new_fields(tel, client):
    ids = [str(i) for i in range(8)]
    base = TensorDict({"x": torch.ones(8, 4)}, batch_size=[8])  # 128 B
    reward = TensorDict({"r": torch.ones(8, dtype=torch.float64)}, batch_size=[8])  # 64 B
    client.put_samples(ids, "p", base)
    client.put_samples(ids, "p", reward)  # a new field on live rows
    assert value(scrape(tel), "dpobs_client_outstanding_size_bytes") == 128 + 64
    client.put_samples(ids[:4], "p", reward[:4])  # rewrites half of one field only
    assert value(scrape(tel), "dpobs_client_outstanding_size_bytes") == 128 + 64
    client.clear_samples(ids[:2], "p")
    s = scrape(tel)
    assert value(s, "dpobs_client_outstanding_size_bytes") == (128 + 64) * 6 / 8
    assert value(s, "dpobs_client_outstanding_keys") == 6


def test_put_with_tags_only_keeps_keys_live(tel, client):
    client.put_samples(["a", "b"], "p", None, tags=[{"k": 1}, {"k": 2}])
    client.put_samples(["a", "b"], "p", None, tags=[{"k": 1}, {"k": 2}])
    s = scrape(tel)
    assert value(s, "dpobs_client_outstanding_keys") == 2
    assert value(s, "dpobs_client_outstanding_size_bytes") == len(msgpack.packb([{"k": 1},
                                                                                {"k": 2}]))


def test_reconciliation_never_releases_puts_that_land_during_its_listing(tel):
    class SlowList(dpobs.InMemoryDataPlane):
        """A listing that takes 5 ms, and a record of what overlapped it."""
        def __init__(self):
            super().__init__()
            self.listing, self.most_at_once, self.puts_during = 0, 0, 0
            self.guard = threading.Lock()

        def list_sample_ids(self, pid):
            with self.guard:
                self.listing += 1
                self.most_at_once = max(self.most_at_once, self.listing)
            try:
                ids = super().list_sample_ids(pid)
                time.sleep(0.005)  # other threads' puts land while this listing is in flight
                return ids
            finally:
                with self.guard:
                    self.listing -= 1

        def put_samples(self, *args, **kwargs):
            with self.guard:
                self.puts_during += self.listing > 0
            return super().put_samples(*args, **kwargs)
    store = SlowList()
    c = tel.instrument(store)
    c._acct.reconcile_rows = 8
    per = 400
    row = TensorDict({"x": torch.ones(1, 2)}, batch_size=[1])

    def work(t):
        for i in range(per):
            c.put_samples([f"{t}-{i}"], "p", row)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert store.puts_during > 0, "no put overlapped a listing: the test proved nothing"
    s = scrape(tel)
    assert value(s, "dpobs_client_outstanding_keys") == 6 * per
    assert value(s, "dpobs_client_outstanding_size_bytes") == 6 * per * 8
    assert store.most_at_once == 1  # never two reconciliations (listings) at once


def test_zero_and_absent_series_are_told_apart(tel, client):
    strict = value  # None for an absent series, so `== 0` cannot pass on one
    s = scrape(tel)
    assert strict(s, "dpobs_client_outstanding_keys") == 0  # exported at 0 from the start
    assert strict(s, OPS, op="put") is None  # no put yet: no series, and not "0"
    assert not (strict(s, OPS, op="put") == 0)
    client.put_samples(["a"], "p", TensorDict({"x": torch.ones(1)}, batch_size=[1]))
    client.clear_samples(None, "p")
    s = scrape(tel)
    assert strict(s, "dpobs_client_outstanding_size_bytes") == 0
    assert strict(s, OPS, op="put") == 1 and strict(s, OPS, op="get") is None


class _OverlappingPlane(dpobs.InMemoryDataPlane):
    """A store that declares protocol.OverlapsGuard: its put signals that its "I/O" has
    begun, then takes the fields to store from the Future."""

    overlaps_guard = True

    def __init__(self, io_started: threading.Event):
        super().__init__()
        self.io_started = io_started
        self.seen = []

    def put_samples(self, sample_ids, partition_id, fields=None, tags=None,
                    pending_fields=None):
        self.io_started.set()
        stored = pending_fields.result(10)
        self.seen.append((fields, stored))
        return super().put_samples(sample_ids, partition_id, stored, tags)


@pytest.fixture
def guarded_tel(monkeypatch):
    monkeypatch.delenv("DPOBS_VERIFY_TENSOR_HASH", raising=False)
    t = dpobs.start(role="test", rank=0, port=0, verify_tensor_hash=True)
    yield t
    t.shutdown()


def _waiting_guard(tel, monkeypatch, fail=False):
    """The guard's before_put, made to wait until the store's put has begun: only a guard
    running beside that put sees it begin (inline, before the call, it waits in vain)."""
    io_started, overlapped = threading.Event(), []
    inner = tel.guard.before_put

    def before_put(*args):
        overlapped.append(io_started.wait(5))
        if fail:
            raise RuntimeError("guard broke")
        return inner(*args)
    monkeypatch.setattr(tel.guard, "before_put", before_put)
    return io_started, overlapped


def test_a_store_that_overlaps_gets_the_digests_from_a_helper_thread(guarded_tel, monkeypatch):
    io_started, overlapped = _waiting_guard(guarded_tel, monkeypatch)
    plane = _OverlappingPlane(io_started)
    c = guarded_tel.instrument(plane)
    td, _ = _batch(4, 1)
    c.put_samples([f"k{i}" for i in range(4)], "p", td)
    (fields, stored), = plane.seen
    assert overlapped == [True] and fields is td  # the caller's fields, untouched
    assert any(guarded_tel.guard.is_digest_field(k) for k in stored.keys())
    got = c.get_samples([f"k{i}" for i in range(4)], "p", ["adv"])
    assert torch.equal(got["adv"], td["adv"]) and list(got.keys()) == ["adv"]
    s = scrape(guarded_tel)
    assert value(s, "dpobs_guard_rows_checked_total", field="adv") == 4
    assert value(s, OPS, op="put") == 1
    assert value(s, "dpobs_instrumentation_time_seconds_total", component="guard") > 0


def test_a_failing_overlapped_guard_stores_the_callers_fields(guarded_tel, monkeypatch):
    io_started, overlapped = _waiting_guard(guarded_tel, monkeypatch, fail=True)
    plane = _OverlappingPlane(io_started)
    c = guarded_tel.instrument(plane)
    td, _ = _batch(2, 2)
    c.put_samples(["a", "b"], "p", td)
    (fields, stored), = plane.seen
    assert overlapped == [True] and stored is td
    s = scrape(guarded_tel)
    assert value(s, "dpobs_instrumentation_errors_total", component="guard") == 1
    assert value(s, OPS, op="put") == 1


def test_the_guard_pool_is_made_anew_in_a_forked_child(monkeypatch):
    from dpobs_otel.guard import pool as guard_pool
    pool = guard_pool.pool()
    assert guard_pool.pool() is pool
    monkeypatch.setattr(guard_pool.os, "getpid", lambda: -1)  # what a child sees
    assert guard_pool.pool() is not pool


def test_a_forked_child_runs_guard_work_on_threads_of_its_own():
    import os

    from dpobs_otel.guard import pool as guard_pool
    guard_pool.pool().submit(lambda: None).result(10)  # the parent's pool is up
    pid = os.fork()
    if pid == 0:  # the child inherits no threads: a job on the parent's pool would hang
        code = 1
        try:
            code = 0 if guard_pool.pool().submit(lambda: 7).result(10) == 7 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# -- an op is counted whatever the store hands back or raises --------------------------
def _gen():
    yield "first"
    yield "second"


RETURNS = {"none": lambda: None, "dict": lambda: {"x": torch.ones(2)},
           "list": lambda: [torch.ones(2), torch.ones(2)], "generator": _gen}


class _Returns:
    """A store whose reads hand back whatever it was given, the same object every time."""

    def __init__(self, result):
        self.result = result

    def get_samples(self, ids, pid, select=None):
        return self.result

    get_data = get_samples


def _counted_once(tel, op, keys):
    s = scrape(tel)
    assert value(s, OPS, op=op) == 1
    assert value(s, "dpobs_client_operation_duration_seconds_sum", op=op) >= 0
    assert value(s, KEYS, op=op) == keys
    assert value(s, BYTES, op=op, direction="read") == 0
    assert value(s, "dpobs_client_rows_missing_total", op=op) == 0
    assert value(s, "dpobs_instrumentation_errors_total", component="client") == 1
    assert not any(name == "dpobs_client_operation_errors_total" for name, _ in s)
    assert tel.step_metrics()[f"dpobs/op/{op}/calls"] == 1


@pytest.mark.parametrize("op", ["get", "get_data"])
@pytest.mark.parametrize("kind", RETURNS)
def test_a_read_that_returns_no_tensordict_is_timed_counted_and_untouched(tel, kind, op):
    returned = RETURNS[kind]()
    c = tel.instrument(_Returns(returned))
    read = c.get_samples if op == "get" else c.get_data
    assert read(["a", "b", "c"], "p") is returned  # the caller's object, not a copy
    if kind == "generator":
        assert next(returned) == "first", "dpobs consumed the store's generator"
    _counted_once(tel, op, keys=3)


def test_a_guarded_read_that_returns_none_is_counted_and_untouched(guarded_tel):
    c = guarded_tel.instrument(_Returns(None))
    assert c.get_samples(["a"], "p") is None
    _counted_once(guarded_tel, "get", keys=1)
    s = scrape(guarded_tel)
    assert value(s, "dpobs_instrumentation_errors_total", component="guard") is None


class _Raises:
    def __init__(self, exc):
        self.exc = exc

    def put_samples(self, *a, **k):
        raise self.exc

    get_samples = get_data = clear_samples = list_sample_ids = put_samples


class StoreDown(ConnectionError):
    """An exception class of the store's own: counted by its own name."""


@pytest.mark.parametrize("exc", [KeyError("k"), ValueError("v"), StoreDown("down"),
                                 KeyboardInterrupt()], ids=lambda e: type(e).__name__)
def test_a_failing_store_raises_its_own_error_on_every_op(tel, exc):
    c = tel.instrument(_Raises(exc))
    calls = [lambda: c.put_samples(["a"], "p", None), lambda: c.get_samples(["a"], "p"),
             lambda: c.get_data(["a"], "p"), lambda: c.clear_samples(["a"], "p"),
             lambda: c.list_sample_ids("p")]
    for call in calls:
        with pytest.raises(type(exc)) as info:
            call()
        assert info.value is exc
    s = scrape(tel)
    for op in ("put", "get", "get_data", "clear", "list"):
        assert value(s, OPS, op=op) == 1
        assert value(s, "dpobs_client_operation_errors_total", op=op,
                     error_type=type(exc).__name__) == 1
    assert value(s, "dpobs_instrumentation_errors_total", component="client") is None


def test_clearing_the_rows_just_put_releases_them_however_the_ids_are_passed(tel, client):
    td, nbytes = _batch(3, 8)
    ids = ["a", "b", "c"]
    client.put_samples(ids, "p", td)
    ids.append("d")  # the caller reuses its list: what was put is still a, b, c
    client.clear_samples(["a", "b", "c"], "p")  # an equal list, not the same object
    s = scrape(tel)
    assert value(s, "dpobs_client_outstanding_keys") == 0
    assert value(s, "dpobs_client_outstanding_size_bytes") == 0
    client.put_samples(["a", "b", "c"], "p", _batch(3, 8)[0])
    client.clear_samples(["c"], "p")
    assert value(scrape(tel), "dpobs_client_outstanding_keys") == 2
    client.clear_samples(["b", "a"], "p")  # the rest, in another order
    s = scrape(tel)
    assert value(s, "dpobs_client_outstanding_keys") == 0
    assert value(s, "dpobs_client_outstanding_size_bytes") == 0
