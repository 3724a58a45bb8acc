"""Row age at read (rowage.py) on the protocol path: every age checked against a truth taken
from a clock the test moves (or measured around the calls), the buckets against a scan of
the bounds written here, and the stamp kept out of the caller's data, bytes and guard."""
from __future__ import annotations

import multiprocessing
import time

import numpy as np
import pytest
import torch
from helpers import scrape, value
from helpers.rowage import telemetries
from helpers.sdk import knows_fast_paths
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel import names, rowage

PART = "p"
AGE = "dpobs_client_row_age_seconds"
UNSTAMPED = "dpobs_client_rows_unstamped_total"


class Clock:
    """The wall clock rowage reads, moved by the test (ns)."""

    def __init__(self, monkeypatch, t0=1_700_000_000 * 10**9):
        self.now = t0
        monkeypatch.setattr(rowage, "_clock", lambda: self.now)

    def advance(self, seconds: float) -> None:
        self.now += round(seconds * 1e9)


@pytest.fixture
def make_tel(monkeypatch):
    for var in ("DPOBS_ROW_AGE", "DPOBS_VERIFY_TENSOR_HASH", "DPOBS_PORT"):
        monkeypatch.delenv(var, raising=False)
    with telemetries() as make:
        yield make


def batch(n, seed=0, width=3) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"obs": torch.randn(n, width, generator=g),
                       "tok": torch.randint(0, 9, (n, 5), generator=g)}, batch_size=[n])


def ids(n, prefix="s"):
    return [f"{prefix}{i}" for i in range(n)]


def expected_buckets(ages) -> dict[str, int]:
    """Cumulative le-bucket counts by a scan of the bounds (a value on a bound is in it)."""
    out = {}
    for b in names.OP_BUCKETS:
        out[str(float(b))] = sum(1 for a in ages if a <= b)
    out["+Inf"] = len(ages)
    return out


def assert_histogram(tel, ages, op="get"):
    m = scrape(tel)
    for le, n in expected_buckets(ages).items():
        assert value(m, AGE + "_bucket", le=le, op=op) == n, le
    assert value(m, AGE + "_count", op=op) == len(ages)
    assert value(m, AGE + "_sum", op=op) == pytest.approx(sum(ages), rel=1e-9, abs=1e-6)


def test_ages_from_the_writers_clock_to_the_readers(make_tel, monkeypatch):
    clock = Clock(monkeypatch)
    tel = make_tel()
    c = tel.instrument(dpobs.InMemoryDataPlane())
    c.put_samples(ids(4), PART, batch(4))  # written at t0
    clock.advance(2.5)
    c.put_samples(ids(3, "x"), PART, batch(3, 1))  # written at t0 + 2.5
    clock.advance(0.75)
    got = c.get_samples(ids(4) + ids(3, "x"), PART, ["obs"])
    assert list(got.keys()) == ["obs"]
    ages = [3.25] * 4 + [0.75] * 3
    assert_histogram(tel, ages)
    step = tel.step_metrics()
    assert step["dpobs/row_age/rows"] == 7
    assert step["dpobs/row_age/mean_s"] == pytest.approx(sum(ages) / 7)
    assert step["dpobs/row_age/max_s"] == pytest.approx(3.25)
    again = tel.step_metrics()  # a window that read nothing: no mean or max of nothing
    assert again["dpobs/row_age/rows"] == 0 and "dpobs/row_age/mean_s" not in again


def test_an_age_on_a_bound_is_in_that_bucket(make_tel, monkeypatch):
    clock = Clock(monkeypatch)
    tel = make_tel()
    c = tel.instrument(dpobs.InMemoryDataPlane())
    c.put_samples(ids(2), PART, batch(2))
    clock.advance(0.25)  # exactly the bound 0.25
    c.get_samples(ids(2), PART)
    assert_histogram(tel, [0.25, 0.25])


def test_the_stamp_never_reaches_the_caller_bytes_or_the_guard(make_tel, monkeypatch):
    """The same puts and reads with row age on and off: the same results, bytes and guard
    counts; the caller's TensorDict is not touched."""
    seen = {}
    for on in (True, False):
        tel = make_tel(row_age=on, guard=True)
        c = tel.instrument(dpobs.InMemoryDataPlane())
        td = batch(6)
        before = sorted(td.keys())
        c.put_samples(ids(6), PART, td)
        assert sorted(td.keys()) == before
        full = c.get_samples(ids(6), PART)
        part = c.get_samples(ids(6), PART, ["tok"])
        assert sorted(full.keys()) == ["obs", "tok"] and list(part.keys()) == ["tok"]
        assert torch.equal(full["obs"], td["obs"])
        m = scrape(tel)
        seen[on] = ({k: v for k, v in m.items() if k[0].startswith(("dpobs_guard_",
                                                                    "dpobs_client_transferred"))},
                    value(m, AGE + "_count", op="get"))
    assert seen[True][0] == seen[False][0]
    assert seen[True][1] == 12 and seen[False][1] is None


@pytest.mark.parametrize("guard", [False, True])
def test_mixed_stamped_and_unstamped_rows(make_tel, monkeypatch, guard):
    clock = Clock(monkeypatch)
    store = dpobs.InMemoryDataPlane()
    stamped = make_tel(guard=guard).instrument(store)
    plain = make_tel(row_age=False, guard=guard).instrument(store)
    reader = make_tel(guard=guard)
    stamped.put_samples(ids(5), PART, batch(5))
    plain.put_samples(ids(3, "u"), PART, batch(3, 1))
    clock.advance(1.5)
    order = ["s0", "u0", "s1", "s2", "u1", "u2", "s3", "s4"]
    got = reader.instrument(store).get_samples(order, PART, ["obs", "tok"])
    assert sorted(got.keys()) == ["obs", "tok"]
    assert_histogram(reader, [1.5] * 5)
    m = scrape(reader)
    assert value(m, UNSTAMPED, op="get", reason="no_stamp") == 3
    assert value(m, UNSTAMPED, op="get", reason="clock_skew") is None
    if guard:  # every row was guarded: all checked, whatever their stamps
        assert value(m, "dpobs_guard_rows_checked_total", field="obs") == 8
        assert value(m, "dpobs_guard_rows_unverified_total", field="obs") is None


def test_a_read_of_rows_nobody_stamped(make_tel):
    store = dpobs.InMemoryDataPlane()
    make_tel(row_age=False).instrument(store).put_samples(ids(4), PART, batch(4))
    reader = make_tel()
    r = reader.instrument(store)
    r.get_samples(ids(4), PART)
    r.get_samples(ids(4), PART, ["obs"])
    m = scrape(reader)
    assert value(m, UNSTAMPED, op="get", reason="no_stamp") == 8
    assert value(m, AGE + "_count", op="get") is None
    assert reader.step_metrics()["dpobs/row_age/rows"] == 0


def test_a_rewrite_or_delta_write_restamps(make_tel, monkeypatch):
    clock = Clock(monkeypatch)
    tel = make_tel()
    c = tel.instrument(dpobs.InMemoryDataPlane())
    c.put_samples(ids(4), PART, batch(4))
    clock.advance(5)
    c.put_samples(ids(2), PART, TensorDict({"adv": torch.ones(2)}, [2]))  # delta write
    clock.advance(5)
    c.put_samples(["s3"], PART, batch(1, 2))  # rewrite
    clock.advance(1)
    c.get_samples(ids(4), PART, ["obs"])
    assert_histogram(tel, [6, 6, 11, 1])


def test_a_writer_clock_ahead_counts_clock_skew_not_an_age(make_tel, monkeypatch):
    clock = Clock(monkeypatch)
    tel = make_tel()
    c = tel.instrument(dpobs.InMemoryDataPlane())
    clock.advance(10)
    c.put_samples(ids(3), PART, batch(3))  # a writer whose clock runs 10 s ahead
    clock.advance(-10)
    c.put_samples(ids(2, "t"), PART, batch(2))
    clock.advance(0.5)
    c.get_samples(ids(3) + ids(2, "t"), PART)
    assert_histogram(tel, [0.5, 0.5])
    assert value(scrape(tel), UNSTAMPED, op="get", reason="clock_skew") == 3


def test_row_age_is_opt_in(make_tel, monkeypatch):
    monkeypatch.setenv(rowage.ENV, "1")
    on = dpobs.start(role="test", port=0)
    try:
        assert on.row_age is not None and on.settings.row_age
    finally:
        on.shutdown()
    tel = make_tel(row_age=False)
    assert tel.row_age is None
    store = dpobs.InMemoryDataPlane()
    tel.instrument(store).put_samples(ids(2), PART, batch(2))
    raw = store.get_samples(ids(2), PART)
    assert sorted(raw.keys()) == ["obs", "tok"]  # nothing hidden was written


BOUNDS = tuple(names.OP_BUCKETS)


def _add(bulk, ages, op):
    bulk.add(bulk.counts_of(ages), float(ages.sum()), float(ages.min()), float(ages.max()), op,
             ages.tolist)


def test_bulk_histogram_equals_one_record_per_row(make_tel, monkeypatch):
    """The bulk path reaches into the SDK's aggregations: pinned here. It must be taken on the
    installed SDK, and export exactly what one record() per age exports; so must the fallback
    (one record() per age) where the internals are not as known, and the one-age path."""
    tel = make_tel()
    ages = np.array([0.25, 0.0003, 0.0001, 0.25, 1.0, 7.0, 31.0, 0.004, 0.0])
    bulk = tel.row_age._hist
    _add(bulk, ages[:3], "get")  # the first: creates the aggregation with one record()
    # the fast path exists, on an SDK whose internals it knows
    assert bool(rowage.histogram_aggregations(bulk._h, {"op": "get"}, BOUNDS)) == \
        knows_fast_paths(bulk._h)
    _add(bulk, ages[3:], "get")
    bulk.add(bulk.counts_of_one(0.5, 4), 2.0, 0.5, 0.5, "get", lambda: [0.5] * 4)
    monkeypatch.setattr(rowage, "histogram_aggregations", lambda h, a, b: [])
    _add(bulk, ages, "get_data")  # the fallback
    for a in ages.tolist() + [0.5] * 4:
        bulk._h.record(a, {"op": "put"})  # the reference: the public API, one per value
    m = scrape(tel)
    for le in expected_buckets(ages.tolist() + [0.5] * 4):
        assert value(m, AGE + "_bucket", le=le, op="get") == value(
            m, AGE + "_bucket", le=le, op="put"), le
    assert value(m, AGE + "_sum", op="get") == pytest.approx(value(m, AGE + "_sum", op="put"))
    for le, n in expected_buckets(ages.tolist()).items():
        assert value(m, AGE + "_bucket", le=le, op="get_data") == n, le


def _write(address, guard) -> tuple[int, int]:
    """In another process: a stamped put; returns the wall clock just before and after it."""
    import time as _t

    import dpobs_otel as d
    from dpobs_otel.stores.memory import connect_store

    tel = d.start(role="rollout", port=0, row_age=True, verify_tensor_hash=guard)
    try:
        c = tel.instrument(connect_store(address))
        before = _t.time_ns()
        c.put_samples(ids(8), PART, batch(8))
        return before, _t.time_ns()
    finally:
        tel.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("guard", [False, True])
def test_writer_and_reader_in_different_processes(make_tel, guard):
    from dpobs_otel.stores.memory import connect_store, serve_store

    manager, address = serve_store()
    try:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            w0, w1 = pool.apply(_write, (address, guard))
        time.sleep(0.3)
        tel = make_tel(guard=guard)
        r0 = time.time_ns()
        got = tel.instrument(connect_store(address)).get_samples(ids(8), PART, ["obs"])
        r1 = time.time_ns()
    finally:
        manager.shutdown()
    assert list(got.keys()) == ["obs"]
    step = tel.step_metrics()
    assert step["dpobs/row_age/rows"] == 8
    # the true age lies between the read's start minus the put's end and its end minus start
    assert (r0 - w1) / 1e9 <= step["dpobs/row_age/mean_s"] <= (r1 - w0) / 1e9
    assert step["dpobs/row_age/max_s"] <= (r1 - w0) / 1e9


def test_a_wrapped_store_that_refuses_the_stamp_column_is_probed_by_halves():
    """A store of the protocol that refuses a select naming a column some rows lack
    (KeyError): the stamps are found by stamp-only reads of the ranges that hold them."""
    stamps = {f"r{i}": (0 if i in (5, 6, 7) else 1000 + i) for i in range(8)}
    reads = []

    def read(rows, cols):
        reads.append(list(rows))
        assert cols == [rowage.STAMP]
        if any(stamps[r] == 0 for r in rows):
            raise KeyError("stamp not written")
        return TensorDict({rowage.STAMP: torch.tensor([stamps[r] for r in rows])}, [len(rows)])

    got = rowage._probe(read, list(stamps), 8)
    assert got.tolist() == [stamps[f"r{i}"] for i in range(8)]
    assert len(reads) <= rowage.MAX_PROBES
    reads.clear()
    assert rowage._probe(read, ["r5", "r6"], 2).tolist() == [0, 0]
    assert len(reads) == 3  # the whole, its halves: nothing found, no deeper level


def test_an_awaited_store_is_stamped_and_aged_like_a_sync_one(make_tel, monkeypatch):
    import asyncio

    class Async:
        def __init__(self):
            self.store = dpobs.InMemoryDataPlane()

        async def put_samples(self, *a, **k):
            return self.store.put_samples(*a, **k)

        async def get_samples(self, *a, **k):
            return self.store.get_samples(*a, **k)

    clock = Clock(monkeypatch)
    tel = make_tel()
    c = tel.instrument(Async())

    async def run():
        await c.put_samples(ids(3), PART, batch(3))
        clock.advance(0.02)
        return await c.get_samples(ids(3), PART, ["tok"])

    got = asyncio.run(run())
    assert list(got.keys()) == ["tok"]
    assert_histogram(tel, [0.02] * 3)
