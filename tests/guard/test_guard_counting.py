"""The wire guard counts every row it could not check (never clean), reads mixed and other-
version digests, stays off by default, and never raises into the step."""
from __future__ import annotations

import logging

import pytest
import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel.guard import hooks
from dpobs_otel.guard import DIGEST_PREFIX, WireGuard, digest_name
from helpers.guard import (GUARD_LOG, IDS, N, TENSOR_FIELDS, batch, by_field, metrics,
                           mismatch_records, total)


# --------------------------------------------------------------------------- declining paths


def test_rows_without_digests_count_unverified_never_clean(guarded):
    tel, client, store = guarded
    store.put_samples(IDS, "old", batch())  # written around the guard
    out = client.get_samples(IDS, "old", ["fp32", "tok"])  # store KeyError -> core retries
    assert set(out.keys()) == {"fp32", "tok"}
    full = client.get_samples(IDS, "old")
    assert not any(k.startswith(DIGEST_PREFIX) for k in full.keys())
    m = metrics(tel)
    assert by_field(m, "dpobs_guard_rows_unverified_total") == {
        **{f: N for f in TENSOR_FIELDS}, "fp32": 2 * N, "tok": 2 * N}
    assert total(m, "dpobs_guard_rows_checked_total") == 0
    assert total(m, "dpobs_guard_rows_mismatched_total") == 0


def test_mixed_read_checks_the_digested_rows_and_counts_only_the_others(guarded, caplog):
    tel, client, store = guarded
    caplog.set_level(logging.INFO, logger=GUARD_LOG)
    # tok excluded before the rows are sliced: tensordict 0.10 cannot slice a jagged field
    client.put_samples(IDS[:4], "mix", batch().exclude("tok")[:4])
    store.put_samples(IDS[4:], "mix", batch().exclude("tok")[4:])  # around the guard
    store._rows["mix"]["s1"][("fp32",)] = store._rows["mix"]["s1"][("fp32",)] + 1
    out = client.get_samples(IDS, "mix", ["fp32", "bf16"])  # KeyError: s4..s7 lack digests
    assert set(out.keys()) == {"fp32", "bf16"}
    assert torch.equal(out["bf16"], batch()["bf16"])
    m = metrics(tel)
    assert by_field(m, "dpobs_guard_rows_checked_total") == {"fp32": 4, "bf16": 4}
    assert by_field(m, "dpobs_guard_rows_unverified_total") == {"fp32": 4, "bf16": 4}
    assert by_field(m, "dpobs_guard_rows_mismatched_total") == {"fp32": 1}
    assert [(f, sid) for f, sid, _ in mismatch_records(caplog)] == [("fp32", "s1")]
    # Interleaved so that both halves of the read lack some digests: the search stops at a
    # level where every digest read failed, and those rows count unverified, not clean.
    order = [IDS[i] for i in (4, 0, 5, 2, 6, 3, 7)]
    client.get_samples(order, "mix", ["bf16"])
    t = tel.guard.totals()
    assert t["checked"]["bf16"] == 4 and t["unverified"]["bf16"] == 4 + len(order)
    # In runs, the halving isolates them: s0 s1 s2 | s3 s4 s5 -> s3 | s4 s5 -> s4 | s5
    client.get_samples(IDS[:6], "mix", ["bf16"])
    t = tel.guard.totals()
    assert t["checked"]["bf16"] == 8 and t["unverified"]["bf16"] == 4 + len(order) + 2
    assert t["mismatched"]["bf16"] == 0 and t["failures"] == {}


def test_select_of_rows_with_another_versions_digests(guarded):
    tel, client, store = guarded
    _v1_written(store, "old")
    out = client.get_samples(IDS, "old", ["fp32"])
    assert set(out.keys()) == {"fp32"}
    m = metrics(tel)
    assert by_field(m, "dpobs_guard_rows_unverified_total") == {"fp32": N}
    assert total(m, "dpobs_guard_rows_mismatched_total") == 0


def test_field_subset_and_delta_write(guarded):
    tel, client, store = guarded
    client.put_samples(IDS, "d", batch())
    before = store._rows["d"]["s1"][(digest_name("bf16"),)].clone()
    new = TensorDict({"fp32": torch.randn(3, 6)}, batch_size=[3])
    client.put_samples(IDS[:3], "d", new)  # a delta write: just its field, just its digests
    assert torch.equal(store._rows["d"]["s1"][(digest_name("bf16"),)], before)
    got = client.get_samples(IDS, "d", ["fp32"])
    assert torch.equal(got["fp32"][:3], new["fp32"])
    m = metrics(tel)
    assert by_field(m, "dpobs_guard_rows_checked_total") == {"fp32": N}
    assert by_field(m, "dpobs_guard_rows_recorded_total")["fp32"] == N + 3
    assert total(m, "dpobs_guard_rows_mismatched_total") == 0


def test_non_tensor_and_malformed_digest_are_skipped_with_a_reason(guarded):
    tel, client, store = guarded
    client.put_samples(IDS, "x", batch())
    for s in IDS:  # a digest column of the wrong shape
        store._rows["x"][s][(digest_name("fp32"),)] = torch.zeros(2, dtype=torch.int64)
    out = client.get_samples(IDS, "x", ["fp32", "meta"])
    assert set(out.keys()) == {"fp32", "meta"}
    m = metrics(tel)
    assert total(m, "dpobs_guard_fields_skipped_total", reason="non_tensor") == 2  # put + get
    assert total(m, "dpobs_guard_fields_skipped_total", reason="digest_malformed") == 1
    assert by_field(m, "dpobs_guard_rows_unverified_total") == {"fp32": N}
    assert total(m, "dpobs_guard_rows_mismatched_total") == 0


def test_caller_payload_untouched_and_no_per_row_state(guarded):
    tel, client, store = guarded
    td = batch()
    keys = set(td.keys())
    client.put_samples(IDS, "k", td)
    assert set(td.keys()) == keys
    guard = tel.guard
    state = dict(vars(guard))
    for i in range(50):
        ids = [f"k{i}-{j}" for j in range(N)]
        client.put_samples(ids, "k", batch(i))
        client.get_samples(ids, "k")
        store.clear_samples(ids, "k")  # cleared around this client, as another process would
    assert vars(guard).keys() == state.keys()
    assert all(vars(guard)[k] is v for k, v in state.items())  # nothing per row, nothing grown


def test_guard_failures_are_counted_never_raised(guarded, monkeypatch):
    tel, client, store = guarded

    def boom(*a, **k):
        raise RuntimeError("fingerprint exploded")

    monkeypatch.setattr("dpobs_otel.guard.hooks.field_digests", boom)
    client.put_samples(IDS, "f", batch())  # does not raise
    out = client.get_samples(IDS, "f")
    assert not any(k.startswith(DIGEST_PREFIX) for k in out.keys())
    assert torch.equal(out["fp32"], batch()["fp32"])
    m = metrics(tel)
    assert total(m, "dpobs_guard_failures_total", error_type="RuntimeError") == 2 * len(TENSOR_FIELDS)
    assert tel.guard.totals()["failures"] == {"RuntimeError": 2 * len(TENSOR_FIELDS)}
    assert by_field(m, "dpobs_guard_rows_unverified_total") == {f: N for f in TENSOR_FIELDS}
    assert total(m, "dpobs_guard_rows_checked_total") == 0


def test_off_by_default_nothing_computed_or_stored(monkeypatch):
    monkeypatch.delenv("DPOBS_VERIFY_TENSOR_HASH", raising=False)

    def forbidden(*a, **k):
        raise AssertionError("a digest was computed with the guard off")

    monkeypatch.setattr(hooks, "field_digests", forbidden)
    monkeypatch.setattr(hooks, "id_salts", forbidden)
    tel = dpobs.start(role="guard-off", rank=0, port=0)
    try:
        assert tel.guard is None
        store = dpobs.InMemoryDataPlane()
        client = tel.instrument(store)
        client.put_samples(IDS, "p", batch())
        client.get_samples(IDS, "p")
        for row in store._rows["p"].values():
            assert not any(k[0].startswith(DIGEST_PREFIX) for k in row)
        assert total(metrics(tel), "dpobs_guard_rows_recorded_total") == 0
    finally:
        tel.shutdown()


# --------------------------------------------------------------------------- WireGuard alone


class DictStore:
    """A plain dict-backed store: the guard's contract without the core."""

    def __init__(self):
        self.rows: dict[str, dict[str, torch.Tensor]] = {}

    def put(self, ids, td):
        for i, s in enumerate(ids):
            self.rows.setdefault(s, {}).update({k: td[k][i] for k in td.keys()})

    def get(self, ids, select=None):
        keys = select if select is not None else list(self.rows[ids[0]])
        return TensorDict({k: torch.stack([self.rows[s][k] for s in ids]) for k in keys},
                          batch_size=[len(ids)])


@pytest.fixture
def bare():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    errors = []
    guard = WireGuard(provider.get_meter("t"), lambda c, e: errors.append((c, e)))

    def counts():
        out = {}
        data = reader.get_metrics_data()
        for rm in data.resource_metrics if data else []:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for p in metric.data.data_points:
                        out[(metric.name, tuple(sorted(p.attributes.items())))] = p.value
        return out

    return guard, errors, counts


def test_bare_guard_round_trip_and_select(bare):
    guard, errors, counts = bare
    store = DictStore()
    td = TensorDict({"a": torch.randn(4, 3), "b": torch.arange(4)}, batch_size=[4])
    ids = ["w", "x", "y", "z"]
    stored = guard.before_put(ids, "p", td)
    assert set(td.keys()) == {"a", "b"}
    assert set(stored.keys()) == {"a", "b", digest_name("a"), digest_name("b")}
    assert stored[digest_name("a")].shape == (4,) and stored[digest_name("a")].dtype == torch.int64
    store.put(ids, stored)
    assert guard.before_get(None) is None
    sel = guard.before_get(["b"])
    assert sel == ["b", digest_name("b")]
    out = guard.after_get(ids[::-1], "p", store.get(ids[::-1], sel), ["b"])
    assert list(out.keys()) == ["b"]
    store.rows["x"]["a"] = store.rows["x"]["a"] * 2
    guard.after_get(ids, "p", store.get(ids, guard.before_get(["a"])), ["a"])
    c = counts()
    assert c[("dpobs.guard.rows.checked", (("field", "a"),))] == 4
    assert c[("dpobs.guard.rows.checked", (("field", "b"),))] == 4
    assert c[("dpobs.guard.rows.mismatched", (("field", "a"),))] == 1
    assert errors == []


def test_bare_guard_digests_not_requested_and_internal_failure(bare):
    guard, errors, counts = bare
    td = TensorDict({"a": torch.randn(4, 3)}, batch_size=[4])
    out = guard.after_get(list("abcd"), "p", td, ["a"], digests_requested=False)
    assert out is td or list(out.keys()) == ["a"]
    assert counts()[("dpobs.guard.rows.unverified", (("field", "a"),))] == 4

    class Weird(TensorDict):
        def items(self, *a, **k):
            raise ValueError("cannot iterate")

    bad = Weird({"a": torch.randn(2), digest_name("a"): torch.zeros(2, dtype=torch.int64)},
                batch_size=[2])
    stripped = guard.after_get(["a", "b"], "p", bad, None)
    assert digest_name("a") not in stripped.keys()  # stripped even though verifying failed
    assert guard.before_put(["a", "b"], "p", bad) is bad  # failure: payload passed unchanged
    assert counts()[("dpobs.guard.failures", (("error_type", "ValueError"),))] == 2
    assert [c for c, _ in errors] == ["guard", "guard"]


def test_mismatched_series_exists_at_zero_once_a_field_is_checked():
    from helpers import scrape, value
    tel = dpobs.start(role="zero", verify_tensor_hash=True)
    try:
        c = tel.instrument(dpobs.InMemoryDataPlane())
        c.put_samples(["a", "b"], "p", TensorDict({"x": torch.ones(2, 3)}, batch_size=[2]))
        c.get_samples(["a", "b"], "p", ["x"])
        samples = scrape(tel)
        assert ("dpobs_guard_rows_mismatched_total", frozenset({("field", "x")})) in samples
        assert value(samples, "dpobs_guard_rows_mismatched_total", field="x") == 0
        assert value(samples, "dpobs_guard_rows_checked_total", field="x") == 2
    finally:
        tel.shutdown()


# --------------------------------------------------------------------------- versions


def _v1_written(store, part):
    """Rows as a version-1 writer left them: its column names, 64-bit digests."""
    td = batch().select("fp32", "tok")
    g = torch.Generator().manual_seed(9)
    for f in ("fp32", "tok"):
        td.set("__dpobs_digest__:" + f, torch.randint(0, 1 << 62, (N,), generator=g))
    store.put_samples(IDS, part, td)


def test_digest_of_another_version_is_unverified_never_mismatched(guarded):
    tel, client, store = guarded
    _v1_written(store, "old")
    out = client.get_samples(IDS, "old")  # a full read: the old columns come back
    assert set(out.keys()) == {"fp32", "tok"}  # stripped, whatever their version
    m = metrics(tel)
    assert by_field(m, "dpobs_guard_rows_unverified_total") == {"fp32": N, "tok": N}
    assert total(m, "dpobs_guard_fields_skipped_total", reason="digest_version") == 2
    assert total(m, "dpobs_guard_rows_mismatched_total") == 0
    assert total(m, "dpobs_guard_rows_checked_total") == 0
