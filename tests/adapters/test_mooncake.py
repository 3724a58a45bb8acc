"""MooncakeDataPlane and instrument_store against a real mooncake_master on loopback.

Skipped only when the mooncake wheel is not installed (`pip install 'dpobs-otel[mooncake]'`,
which `make` does); an installed wheel that fails to import (e.g. libibverbs1 missing)
fails here instead."""
from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import multiprocessing
import os
import time
import urllib.request

import msgpack
import pytest
import torch
from conftest import scrape, value
from tensordict import NonTensorData, NonTensorStack, TensorDict

if importlib.util.find_spec("mooncake") is None:
    pytest.skip("the mooncake wheel is not installed (pip install 'dpobs-otel[mooncake]')",
                allow_module_level=True)

import mooncake.store  # noqa: E402,F401  an installed wheel must import: no skip past here

import dpobs_otel as dpobs  # noqa: E402
from dpobs_otel.adapters.mooncake import MooncakeDataPlane, MooncakeError  # noqa: E402
from dpobs_otel.adapters.mooncake import instrument_store  # noqa: E402
from dpobs_otel.adapters.mooncake_index import COMPACT_EVERY  # noqa: E402
from dpobs_otel.adapters.mooncake_leases import DeferredRemovals  # noqa: E402
from dpobs_otel.adapters.mooncake_master import MooncakeMaster, connect_store  # noqa: E402
from stores.test_memory import _batch  # noqa: E402  the in-memory store's cases, mirrored
from guard.test_guard_crossprocess import N, PART, _payload  # noqa: E402  its GRPO rows
from hypothesis import HealthCheck, given, settings  # noqa: E402
from test_client import payloads  # noqa: E402  the core suite's payload strategy

LEASE_MS = 300
IDS = ["a", "b", "c"]
OPS = "dpobs_client_operation_duration_seconds_count"
BYTES = "dpobs_client_transferred_bytes_total"
KEYS = "dpobs_client_keys_total"
ERRORS = "dpobs_client_operation_errors_total"
_ns = itertools.count()


@pytest.fixture(scope="module")
def master():
    with MooncakeMaster(lease_ms=LEASE_MS) as m:
        yield m


@pytest.fixture(scope="module")
def store(master):
    s = master.connect()
    yield s
    s.close()


@pytest.fixture
def dp(store, master):
    plane = MooncakeDataPlane(store, namespace=f"t{next(_ns)}", lease_s=master.lease_s)
    yield plane
    plane.close()


def _master_keys(master) -> list[str]:
    body = urllib.request.urlopen(master.admin_url + "/get_all_keys", timeout=10).read()
    return [k for k in body.decode().split("\n") if k]


def _bits(t: torch.Tensor) -> list:
    return t.contiguous().reshape(-1).view(torch.uint8).tolist() if t.numel() else []


# -- the protocol, mirroring tests/stores/test_memory.py ------------------------------
def test_round_trip_keeps_jagged_dense_and_nontensor(dp):
    dp.put_samples(IDS, "p", _batch())
    out = dp.get_samples(["c", "a"], "p")
    assert out.batch_size == torch.Size([2])
    assert out["tok"].is_nested
    assert [r.tolist() for r in out["tok"].unbind()] == [[0, 1, 2], [0, 1]]
    assert torch.equal(out["adv"], torch.tensor([[5.0, 6.0], [1.0, 2.0]]))
    assert out.get("meta").tolist() == ["z", "x"]


def test_uniform_jagged_rows_come_back_dense(dp):
    tok = torch.nested.nested_tensor([torch.arange(4), torch.arange(4) + 1], layout=torch.jagged)
    dp.put_samples(["a", "b"], "p", TensorDict({"tok": tok}, batch_size=[2]))
    out = dp.get_samples(["a", "b"], "p")["tok"]
    assert not out.is_nested and out.tolist() == [[0, 1, 2, 3], [1, 2, 3, 4]]


DTYPES = [torch.float32, torch.bfloat16, torch.bool, torch.int64, torch.float8_e4m3fn,
          torch.complex64, torch.uint8, torch.float16, torch.int32, torch.float64,
          torch.int16, torch.int8, torch.float8_e5m2, torch.uint16, torch.uint32, torch.uint64,
          torch.complex128, torch.float8_e4m3fnuz]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(4,), (4, 3), (4, 0), (4, 2, 3), (4, 1)], ids=str)
def test_every_dtype_and_shape_round_trips_bit_exact(dp, dtype, shape):
    g = torch.Generator().manual_seed(sum(shape) + len(str(dtype)))
    t = (torch.randn(shape, generator=g) * 3).to(dtype)
    ids = [f"r{i}" for i in range(shape[0])]
    dp.put_samples(ids, "p", TensorDict({"x": t}, batch_size=[shape[0]]))
    out = dp.get_samples(ids[::-1], "p")["x"]  # row by row, reversed
    assert out.dtype == dtype and out.shape == torch.Size(shape)  # (N,) stays (N,)
    assert _bits(out) == _bits(t[torch.arange(shape[0] - 1, -1, -1)])


def test_non_contiguous_and_expanded_views_round_trip(dp):
    base = torch.arange(12.0).reshape(3, 4)
    td = TensorDict({"t": base.t(), "e": torch.tensor([[1.5]]).expand(4, 5)}, batch_size=[4])
    ids = ["w", "x", "y", "z"]
    dp.put_samples(ids, "p", td)
    out = dp.get_samples(ids, "p")
    assert torch.equal(out["t"], base.t()) and torch.equal(out["e"], torch.full((4, 5), 1.5))


def test_nested_tensordict_fields_and_tags(dp):
    td = TensorDict({"obs": TensorDict({"a": torch.ones(2, 3), "b": torch.zeros(2)}, [2])},
                    batch_size=[2])
    dp.put_samples(["u", "v"], "p", td, tags=[{"step": 1}, {"step": 2}])
    out = dp.get_samples(["v"], "p", [("obs", "a")])
    assert list(out.keys(include_nested=True, leaves_only=True)) == [("obs", "a")]
    assert dp.get_samples(["u", "v"], "p")["obs", "b"].shape == (2,)
    assert dp.get_tags(["v", "u", "nope"], "p") == [{"step": 2}, {"step": 1}, None]


def test_select_fields_and_delta_writes(dp):
    dp.put_samples(IDS, "p", _batch())
    dp.put_samples(["b"], "p", TensorDict({"extra": torch.tensor([9])}, batch_size=[1]))
    assert set(dp.get_samples(["b"], "p").keys()) == {"tok", "adv", "meta", "extra"}
    assert set(dp.get_samples(IDS, "p").keys()) == {"tok", "adv", "meta"}  # common only
    assert list(dp.get_samples(["a"], "p", ["adv"]).keys()) == ["adv"]
    with pytest.raises(KeyError, match="extra.*'a'"):
        dp.get_samples(["a", "b"], "p", ["extra"])
    # a rewrite replaces (Mooncake's put would keep the old object; the adapter upserts)
    dp.put_samples(["a"], "p", TensorDict({"adv": torch.tensor([[7.0, 8.0]])}, [1]))
    assert dp.get_samples(["a"], "p", ["adv"])["adv"].tolist() == [[7.0, 8.0]]


def test_store_copies_the_callers_buffers(dp):
    td = _batch()
    dp.put_samples(IDS, "p", td)
    td["adv"].zero_()
    assert dp.get_samples(["a"], "p")["adv"].tolist() == [[1.0, 2.0]]


def test_missing_id_and_partition_name_themselves(dp):
    dp.put_samples(IDS, "p", _batch())
    with pytest.raises(KeyError, match="'zz'.*'p'"):
        dp.get_samples(["a", "zz"], "p")
    with pytest.raises(KeyError, match="'nope'"):
        dp.get_samples(["a"], "nope")
    with pytest.raises(KeyError, match="'nope'"):
        dp.list_sample_ids("nope")
    with pytest.raises(ValueError, match="batch size"):
        dp.put_samples(["a"], "p", _batch())


def test_clear_subset_and_whole_partition(dp):
    dp.put_samples(IDS, "p", _batch())
    dp.clear_samples(["b"], "p")
    assert dp.list_sample_ids("p") == ["a", "c"]
    with pytest.raises(KeyError, match="'b'"):
        dp.clear_samples(["b"], "p")
    dp.clear_samples(None, "p")
    assert dp.list_sample_ids("p") == []  # registered, empty, as in the in-memory store


def test_claim_meta_hands_each_id_once_per_consumer(dp):
    dp.put_samples(IDS, "p", _batch())
    assert dp.claim_meta("p", 2) == ["a", "b"]
    assert dp.claim_meta("p", 2) == ["c"]
    assert dp.claim_meta("p", 5, consumer="other") == IDS


def test_names_with_separators_do_not_collide(dp):
    one = TensorDict({"x": torch.tensor([1])}, [1])
    two = TensorDict({"x": torch.tensor([2])}, [1])
    dp.put_samples(["a/b"], "p", one)
    dp.put_samples(["b"], "p/a", two)  # would be the same key without escaping
    dp.put_samples(["a%2Fb"], "p", two)
    assert dp.get_samples(["a/b"], "p")["x"].tolist() == [1]
    assert dp.list_sample_ids("p") == ["a/b", "a%2Fb"]


def test_unsupported_value_is_the_stores_error_not_silence(dp):
    with pytest.raises(TypeError):
        dp.put_samples(["a"], "p", TensorDict({"x": torch.ones(1)}, [1]), tags=[{"f": object()}])


def test_empty_requests(dp):
    dp.put_samples([], "p", TensorDict({"x": torch.ones(0, 2)}, [0]))
    assert dp.list_sample_ids("p") == []
    assert dp.get_samples([], "p").batch_size == torch.Size([0])
    dp.put_samples(["a"], "p")  # a row with no fields
    assert dp.list_sample_ids("p") == ["a"] and list(dp.get_samples(["a"], "p").keys()) == []
    dp.clear_samples([], "p")
    assert dp.list_sample_ids("p") == ["a"]


def _rows(v):
    if isinstance(v, torch.Tensor):
        return [(r.dtype, tuple(r.shape), _bits(r)) for r in v.unbind(0)]
    return v.tolist()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads())
def test_random_payloads_round_trip_and_count_exactly(tel, dp, payload):
    """The core suite's payload strategy (every dtype, empty dims, non-contiguous views,
    jagged rows, any non-tensor value) through a measured MooncakeDataPlane."""
    td, truth, exact = payload
    c = tel.instrument(dp)
    ids = [f"h{next(_ns)}-{i}" for i in range(td.batch_size[0])]
    before = tel.stats.ops["put"].write_bytes if "put" in tel.stats.ops else 0
    c.put_samples(ids, "hyp", td)
    out = c.get_samples(ids, "hyp")
    c.clear_samples(ids, "hyp")
    assert set(out.keys()) == set(td.keys())
    for k in td.keys():
        if k == "meta":
            v = td.get(k).data
            if exact:  # object() comes back a new object: only its type is kept
                assert out.get(k).tolist() == [v] * len(ids)
            continue
        assert _rows(out[k]) == _rows(td[k])
    assert tel.stats.instr_errors.get("client", 0) == 0
    if exact:
        assert tel.stats.ops["put"].write_bytes - before == truth


def test_writers_slots_order_clears_and_re_puts_and_stay_compact(store):
    """Two planes (two owners, as two processes would be) on one partition."""
    ns = f"t{next(_ns)}"
    a, b = (MooncakeDataPlane(store, namespace=ns) for _ in range(2))
    one = TensorDict({"x": torch.ones(1)}, [1])
    a.put_samples(["x"], "p", one)
    b.put_samples(["y"], "p", one)
    assert a.list_sample_ids("p") == b.list_sample_ids("p") == ["x", "y"]
    b.clear_samples(["x"], "p")  # a clear of a row another owner put
    assert a.list_sample_ids("p") == ["y"]
    a.put_samples(["x"], "p", one)  # put again after the clear: live again, newest last
    assert b.list_sample_ids("p") == ["y", "x"]
    b.clear_samples(["x"], "p")
    for i in range(COMPACT_EVERY):  # a's puts reach a compaction
        a.put_samples([f"n{i}"], "p", one)
    slots = {c["o"]: c for _, c in a._index._scan("p")}
    assert "x" not in slots[a._index._owner]["a"]  # a's put of x, superseded, is gone
    b.clear_samples(["y"], "p")  # b's next write compacts b's slot
    slots = {c["o"]: c for _, c in a._index._scan("p")}
    assert slots[b._index._owner]["d"] == {} and slots[b._index._owner]["a"] == {}
    assert a.list_sample_ids("p") == [f"n{i}" for i in range(COMPACT_EVERY)]


class _Blinking:
    """A store whose next answer for `key` reads as absent, as while another client
    upserts it (measured: a key being upserted reads as absent for a moment)."""

    def __init__(self, store, key):
        self._store, self.key, self.blinked = store, key, 0

    def __getattr__(self, name):
        return getattr(self._store, name)

    def _blink(self, keys, out, absent):
        if self.key in keys and not self.blinked:
            self.blinked += 1
            out = list(out)
            out[keys.index(self.key)] = absent
        return out

    def get_batch(self, keys):
        return self._blink(keys, self._store.get_batch(keys), b"")

    def batch_get_tensor(self, keys):
        return self._blink(keys, self._store.batch_get_tensor(keys), None)


@pytest.mark.parametrize("which", ["manifest", "value"])
def test_a_key_caught_mid_rewrite_is_read_once_more(store, which):
    writer = MooncakeDataPlane(store, namespace=f"t{next(_ns)}")
    writer.put_samples(IDS, "p", _batch())
    key = writer._row_key("p", "b") + ("/adv" if which == "value" else "")
    blinking = _Blinking(store, key)
    reader = MooncakeDataPlane(blinking, namespace=writer._ns)
    assert reader.get_samples(IDS, "p")["adv"].tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    assert blinking.blinked == 1


# -- the read lease -------------------------------------------------------------------
def test_remove_right_after_a_read_meets_the_lease(store):
    """The premise of the deferral, measured on the real master."""
    store.put_tensor("lease-probe", torch.ones(2))
    assert store.get_tensor("lease-probe") is not None
    assert store.remove("lease-probe") == -706


def test_put_read_clear_loop_does_not_leak_leased_rows(dp, master):
    ns_keys = lambda: [k for k in _master_keys(master) if k.startswith(dp._ns + "/")]  # noqa: E731
    pending_seen = []
    for step in range(6):
        ids = [f"s{step}-{i}" for i in range(8)]
        dp.put_samples(ids, "loop", _batch_n(8))
        dp.get_samples(ids, "loop")  # every key read: each remove meets a lease
        dp.clear_samples(ids, "loop")
        pending_seen.append(dp.pending_clears)
        with pytest.raises(KeyError):  # cleared now, whatever the store still holds
            dp.get_samples(ids[:1], "loop")
    assert min(pending_seen) > 0  # the lease really was met
    assert dp.flush_clears(timeout=10 * master.lease_s + 5)
    assert dp.pending_clears == 0 and dp._deferred.removed > 0
    slot = f"{dp._ns}/loop/.slot/0"
    assert sorted(ns_keys()) == [slot, f"{slot}/0", f"{slot}/1"]  # only the listing is left
    (_, content), = dp._index._scan("loop")
    assert content["a"] == {} and content["d"] == {}  # and it is compacted


def test_a_row_put_again_survives_its_earlier_deferred_removal(dp, master):
    td = TensorDict({"x": torch.tensor([[1.0]])}, [1])
    dp.put_samples(["k"], "p", td)
    dp.get_samples(["k"], "p")
    dp.clear_samples(["k"], "p")
    assert dp.pending_clears > 0
    dp.put_samples(["k"], "p", TensorDict({"x": torch.tensor([[2.0]])}, [1]))
    assert dp.flush_clears(timeout=10 * master.lease_s + 5)
    assert dp.get_samples(["k"], "p")["x"].tolist() == [[2.0]]


def test_deferred_removals_retry_leased_keys_and_drop_the_rest():
    answers = {"a": [-706, 0], "b": [-704], "c": [-900], "d": [-706, -706, 0]}
    asked = []

    def remove(keys):
        asked.append(sorted(keys))
        return [answers[k].pop(0) for k in keys]
    q = DeferredRemovals(remove, retry_s=60.0)  # the thread never fires in this test
    q.add(["a", "b", "c", "d", "e"])
    q.cancel(["e"])  # put again: never removed
    t0 = time.monotonic()
    q.run_due(t0)  # nothing due yet
    assert asked == [] and len(q) == 4
    q.run_due(t0 + 61)
    assert asked == [["a", "b", "c", "d"]] and len(q) == 2  # a and d leased again
    q.run_due(t0 + 62)  # rescheduled a retry_s later, not yet
    assert len(asked) == 1
    q.run_due(t0 + 122)
    q.run_due(t0 + 183)
    assert len(q) == 0 and q.removed == 3 and q.failed == 1
    assert asked[-1] == ["d"]
    q.close()


def _batch_n(n):
    return TensorDict({"x": torch.arange(n * 3, dtype=torch.float32).reshape(n, 3),
                       "tok": torch.nested.nested_tensor([torch.arange(i + 1) for i in range(n)],
                                                         layout=torch.jagged)}, [n])


# -- measured through dpobs -----------------------------------------------------------
def test_protocol_workload_counts_and_bytes_are_exact(tel, dp):
    client = tel.instrument(dp)
    truth = {"put": 0, "get": 0, "keys_get": 0}
    ids_all = []
    for step in range(5):
        n = 3 + step
        ids = [f"s{step}-{i}" for i in range(n)]
        td = _batch_n(n)
        td["meta"] = NonTensorData({"step": step})
        client.put_samples(ids, "train", td)
        truth["put"] += n * 3 * 4 + sum(range(1, n + 1)) * 8 + len(msgpack.packb({"step": step}))
        got = client.get_samples(ids[:2], "train", ["tok", "x"])
        truth["get"] += got["tok"].values().nbytes + got["x"].nbytes
        truth["keys_get"] += 2
        ids_all += ids
    client.clear_samples(ids_all[:4], "train")
    client.clear_samples(None, "train")
    s = scrape(tel)
    assert value(s, OPS, op="put") == 5 and value(s, OPS, op="get") == 5
    assert value(s, OPS, op="clear") == 2
    assert value(s, BYTES, op="put", direction="write") == truth["put"]
    assert value(s, BYTES, op="get", direction="read") == truth["get"]
    assert value(s, KEYS, op="put") == len(ids_all) and value(s, KEYS, op="get") == 10
    assert value(s, KEYS, op="clear") == len(ids_all)
    assert value(s, "dpobs_client_outstanding_keys") == 0
    with pytest.raises(KeyError):
        client.get_samples(["ghost"], "train")
    assert value(scrape(tel), ERRORS, op="get", error_type="KeyError") == 1


def test_a_code_the_plane_raises_is_counted_with_the_code(tel, store):
    class Refusing(_Blinking):
        def upsert_batch(self, keys, values):
            return -800  # TRANSFER_FAIL

    client = tel.instrument(MooncakeDataPlane(Refusing(store, None), namespace="refusing"))
    with pytest.raises(MooncakeError) as info:
        client.put_samples(["a"], "p", TensorDict({"x": torch.ones(1)}, [1]))
    assert info.value.code == -800 and type(info.value).__name__ == "MooncakeError-800"
    assert value(scrape(tel), ERRORS, op="put", error_type="MooncakeError-800") == 1


def test_raw_store_ops_exact_bytes_codes_and_misses(tel, store):
    raw = instrument_store(tel, store)
    a, b = torch.arange(12, dtype=torch.float32), torch.ones(5, 7, dtype=torch.bfloat16)
    keys = ["raw-a", "raw-b", "raw-c"]
    assert raw.put_tensor(keys[0], a) == 0
    assert raw.batch_put_tensor(keys[1:], [b, torch.zeros(3, dtype=torch.int64)]) == [0, 0]
    assert raw.put("raw-bytes", b"hello world") == 0
    written = a.nbytes + b.nbytes + 24 + 11
    stored = sum(store.get_size(k) for k in keys)  # Mooncake's own sizes: with headers
    assert stored > a.nbytes + b.nbytes + 24  # so they are not what the series count
    got = raw.batch_get_tensor(keys[:2] + ["raw-missing"])
    assert got[2] is None and torch.equal(got[0], a)
    assert raw.get("raw-bytes") == b"hello world"
    assert raw.get_tensor("raw-missing") is None
    assert raw.remove("raw-a") == -706  # read (and sized) just now: leased
    assert raw.remove("raw-never") == -704
    s = scrape(tel)
    assert value(s, OPS, op="put") == 3 and value(s, KEYS, op="put") == 4
    assert value(s, BYTES, op="put", direction="write") == written
    assert value(s, BYTES, op="get", direction="read") == a.nbytes + b.nbytes + 11
    assert value(s, "dpobs_client_rows_missing_total", op="get") == 2
    assert value(s, ERRORS, op="clear", error_type="MooncakeError-706") == 1
    assert value(s, ERRORS, op="clear", error_type="MooncakeError-704") == 1
    assert value(s, OPS, op="clear") == 2
    assert value(s, "dpobs_client_outstanding_keys") == 4  # raw-a is still there
    # A mixed batch: the removed keys and their calls count, the leased one is an error.
    codes = raw.batch_remove(["raw-a", "raw-bytes"])
    assert codes[1] in (0, -706)
    s = scrape(tel)
    assert value(s, OPS, op="clear") == 3
    assert value(s, ERRORS, op="clear", error_type="MooncakeError-706") == 1 + (-706 in codes)


def test_raw_store_exceptions_propagate_unchanged_and_codes_are_errors(tel, store):
    raw = instrument_store(tel, store)
    with pytest.raises(TypeError) as info:
        raw.put_tensor(123, torch.ones(1))  # pybind refuses the key: a real exception
    with pytest.raises(TypeError) as bare:
        store.put_tensor(123, torch.ones(1))
    assert str(info.value) == str(bare.value)
    assert raw.put_tensor("raw-x", "not a tensor") == -600  # Mooncake's code, unchanged
    s = scrape(tel)
    assert value(s, ERRORS, op="put", error_type="TypeError") == 1
    assert value(s, ERRORS, op="put", error_type="MooncakeError-600") == 1
    assert value(s, OPS, op="put") == 2
    assert value(s, BYTES, op="put", direction="write") == 0
    assert value(s, "dpobs_client_outstanding_keys") == 0
    assert raw.get_hostname() == store.get_hostname()  # unmeasured methods pass through


def test_raw_store_occupancy_returns_to_zero(tel, store):
    raw = instrument_store(tel, store)
    raw.batch_put_tensor(["occ-1", "occ-2"], [torch.ones(4), torch.ones(8)])
    raw.upsert("occ-3", b"xyz")
    assert value(scrape(tel), "dpobs_client_outstanding_size_bytes") == 51
    assert raw.remove_by_regex("^occ-") == 3  # nothing read them: no lease
    s = scrape(tel)
    assert value(s, "dpobs_client_outstanding_keys") == 0
    assert value(s, KEYS, op="clear") == 3


# -- the wire guard across processes ------------------------------------------------
_WORKER: dict = {}


def _plane(addr):
    """This worker's data plane; its store (and segment) stays up for later calls."""
    if "plane" not in _WORKER:
        _WORKER["plane"] = MooncakeDataPlane(connect_store(*addr, 32 << 20, 32 << 20),
                                             namespace="guard", lease_s=LEASE_MS / 1000)
    return _WORKER["plane"]


def _setup(addr) -> None:
    _plane(addr)


def _close_plane() -> None:
    plane = _WORKER.pop("plane", None)
    if plane is not None:
        plane.close()
        plane.store.close()  # unmount the segment now, not a client_ttl after the kill


@contextlib.contextmanager
def _workers(n: int):
    """n one-process pools (spawned); each worker's store closed before the pools go."""
    ctx = multiprocessing.get_context("spawn")
    pools = [ctx.Pool(1) for _ in range(n)]
    try:
        yield pools
    finally:
        for p in pools:
            try:
                p.apply(_close_plane)
            finally:
                p.terminate()


def _guard_counts(tel) -> dict:
    """{recorded|checked|mismatched|unverified: rows over all fields}."""
    return {k: sum(v.values()) for k, v in tel.guard.totals().items()
            if k in ("recorded", "checked", "mismatched", "unverified")}


def _writer(addr) -> dict:
    tel = dpobs.start(role="rollout", rank=0, port=0, verify_tensor_hash=True)
    try:
        client = tel.instrument(_plane(addr))
        client.register_partition(PART)
        client.put_samples([f"uid-{i}" for i in range(N)], PART, _payload())
        return _guard_counts(tel)
    finally:
        tel.shutdown()


def _tamper(addr) -> None:
    """A bare client, no guard: flip one bit of one row, keep the writer's digest column."""
    raw = _plane(addr)
    row = raw.get_samples(["uid-17"], PART)
    logp = row["logprobs"].clone()
    logp.view(torch.int16)[0, 3] ^= 1
    row.set("logprobs", logp)
    raw.put_samples(["uid-17"], PART, row)


def _reader(addr) -> dict:
    tel = dpobs.start(role="trainer", rank=1, port=0, verify_tensor_hash=True)
    try:
        client = tel.instrument(_plane(addr))
        out = client.get_samples([f"uid-{i}" for i in range(N)][::-1], PART)
        return {"counts": _guard_counts(tel), "keys": sorted(out.keys()), "pid": os.getpid()}
    finally:
        tel.shutdown()


@pytest.mark.slow
def test_guard_across_processes_catches_a_row_rewritten_by_a_bare_client(master):
    addr = (master.rpc_address, master.metadata_url)
    with _workers(3) as (writer, reader, tamperer):
        written = writer.apply(_writer, (addr,))
        assert written["recorded"] == 4 * N  # the four tensor fields
        clean = reader.apply(_reader, (addr,))
        assert clean["pid"] != os.getpid()
        c = clean["counts"]
        assert c["checked"] == 4 * N
        assert c["mismatched"] == 0
        assert c["unverified"] == 0
        assert clean["keys"] == ["advantages", "input_ids", "logprobs", "mask", "prompt"]  # digests stripped
        tamperer.apply(_tamper, (addr,))
        caught = reader.apply(_reader, (addr,))["counts"]
    assert caught["mismatched"] == 1
    assert caught["checked"] == 4 * N


def _fan_in(addr, w, steps) -> list[str]:
    """One writer of a shared partition: puts 8 rows a step, clears half of every third."""
    plane, live = _plane(addr), []
    td = TensorDict({"x": torch.ones(8, 4)}, [8])
    for i in range(steps):
        ids = [f"w{w}-{i}-{j}" for j in range(8)]
        plane.put_samples(ids, "fan-in", td)
        live += ids
        if i % 3 == 2:
            plane.clear_samples(ids[:4], "fan-in")
            live = [sid for sid in live if sid not in ids[:4]]
    return live


@pytest.mark.slow
def test_writers_in_several_processes_share_a_partition_listing(master, store):
    """No key is written by two processes, so concurrent writers lose nothing, and a
    listing taken meanwhile never misses an id that the listings before and after have."""
    addr = (master.rpc_address, master.metadata_url)
    reader = MooncakeDataPlane(store, namespace="guard", lease_s=master.lease_s)
    reader.register_partition("fan-in")
    with _workers(3) as pools:
        for p in pools:  # set the clients up one at a time, then write all at once
            p.apply(_setup, (addr,))
        jobs = [p.apply_async(_fan_in, (addr, w, 40)) for w, p in enumerate(pools)]
        listings = []
        while not all(j.ready() for j in jobs):
            listings.append(set(reader.list_sample_ids("fan-in")))
        expected = [sid for j in jobs for sid in j.get(timeout=60)]
        final = reader.list_sample_ids("fan-in")
    reader.close()
    assert sorted(final) == sorted(expected) and len(final) == 3 * 40 * 8 - 3 * 13 * 4
    flicker = set()
    for before, now, after in zip(listings, listings[1:], listings[2:]):
        flicker |= (before & after) - now
    assert len(listings) > 3 and not flicker


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 as /proc has them


def _listening(pids) -> dict[int, str]:
    """{port: address} of every TCP socket in LISTEN that these processes hold."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    out = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(path).read().splitlines()[1:]:
            cols = line.split()
            addr, port = cols[1].rsplit(":", 1)
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                out[int(port, 16)] = addr
    return out


def test_master_listens_on_loopback_only(master):
    """Every socket the launcher's processes listen on (the master's RPC and admin servers,
    the metadata server, anything else they open) is bound to loopback: read from the
    kernel's socket tables, not from our flags."""
    seen = _listening(master.pids)
    assert len(master.pids) == 2
    assert {master.rpc_port, master.metadata_port, master.metrics_port} <= set(seen)
    assert set(seen.values()) <= LOOPBACK, json.dumps(seen)
