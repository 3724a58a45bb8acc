"""MooncakeDataPlane against a real mooncake_master on loopback: the in-memory store's cases,
every dtype and layout, the listing's slots, re-reads, and clears that meet a read lease.
Skipped only when the mooncake wheel is not installed (helpers.mooncake)."""
from __future__ import annotations

import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from tensordict import TensorDict

from helpers.mooncake import (IDS, Blinking, MooncakeDataPlane, batch_n, bits, master_keys,
                              namespaces)
from helpers.payloads import payloads  # the core suite's payload strategy
from helpers.payloads import three_rows as _batch  # the in-memory store's cases, mirrored

from dpobs_otel.adapters.mooncake.index import COMPACT_EVERY
from dpobs_otel.adapters.mooncake.leases import DeferredRemovals


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
    assert bits(out) == bits(t[torch.arange(shape[0] - 1, -1, -1)])


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
        return [(r.dtype, tuple(r.shape), bits(r)) for r in v.unbind(0)]
    return v.tolist()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payloads())
def test_random_payloads_round_trip_and_count_exactly(tel, dp, payload):
    """The core suite's payload strategy (every dtype, empty dims, non-contiguous views,
    jagged rows, any non-tensor value) through a measured MooncakeDataPlane."""
    td, truth, exact = payload
    c = tel.instrument(dp)
    ids = [f"h{next(namespaces)}-{i}" for i in range(td.batch_size[0])]
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
    ns = f"t{next(namespaces)}"
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



@pytest.mark.parametrize("which", ["manifest", "value"])
def test_a_key_caught_mid_rewrite_is_read_once_more(store, which):
    writer = MooncakeDataPlane(store, namespace=f"t{next(namespaces)}")
    writer.put_samples(IDS, "p", _batch())
    key = writer._row_key("p", "b") + ("/adv" if which == "value" else "")
    blinking = Blinking(store, key)
    reader = MooncakeDataPlane(blinking, namespace=writer._ns)
    assert reader.get_samples(IDS, "p")["adv"].tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    assert blinking.blinked == 1


@pytest.mark.parametrize("part", ["", "/0", "/1"], ids=["claim", "half-0", "half-1"])
def test_a_slot_that_exists_but_answers_nothing_is_read_again(store, part):
    """A read whose lease runs out before its transfer ends answers nothing (LEASE_EXPIRED:
    a fresh-clone CI's listing on a loaded machine then said "partition does not exist"). The
    index asks whether such a key exists and reads it again, so the listing is whole."""
    writer = MooncakeDataPlane(store, namespace=f"t{next(namespaces)}")
    writer.put_samples(IDS, "p", _batch())
    blinking = Blinking(store, f"{writer._ns}/p/.slot/0{part}")
    reader = MooncakeDataPlane(blinking, namespace=writer._ns)
    assert reader.list_sample_ids("p") == IDS
    assert blinking.blinked == 1


# -- the read lease -------------------------------------------------------------------
def test_remove_right_after_a_read_meets_the_lease(store):
    """The premise of the deferral, measured on the real master."""
    store.put_tensor("lease-probe", torch.ones(2))
    assert store.get_tensor("lease-probe") is not None
    assert store.remove("lease-probe") == -706


def test_put_read_clear_loop_does_not_leak_leased_rows(dp, master):
    ns_keys = lambda: [k for k in master_keys(master) if k.startswith(dp._ns + "/")]  # noqa: E731
    pending_seen = []
    for step in range(6):
        ids = [f"s{step}-{i}" for i in range(8)]
        dp.put_samples(ids, "loop", batch_n(8))
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


