"""The wire guard: a corruption matrix caught and attributed, a randomized soak with no false
alarm, every declining path counted, off by default, and never raising into the step."""
from __future__ import annotations

import logging
import random

import pytest
import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from tensordict import NonTensorStack, TensorDict

import dpobs_otel as dpobs
from dpobs_otel.guard import hooks
from dpobs_otel.guard import DIGEST_PREFIX, WireGuard, digest_name

GUARD_LOG = "dpobs_otel.guard"


# --------------------------------------------------------------------------- helpers


def metrics(tel) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in tel.registry.collect():
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def total(m, name, **labels) -> float:
    want = {(k, str(v)) for k, v in labels.items()}
    return sum(v for (n, lab), v in m.items() if n == name and want <= lab)


def by_field(m, name) -> dict[str, float]:
    return {dict(lab)["field"]: v for (n, lab), v in m.items() if n == name and v}


@pytest.fixture
def guarded(monkeypatch):
    monkeypatch.delenv("DPOBS_VERIFY_TENSOR_HASH", raising=False)
    tel = dpobs.start(role="guard-test", rank=0, port=0, verify_tensor_hash=True)
    store = dpobs.InMemoryDataPlane()
    yield tel, tel.instrument(store), store
    tel.shutdown()


def mismatch_records(caplog) -> list[tuple[str, str, int]]:
    """(field, sample id, row index) of every mismatch line the guard logged."""
    out = []
    for r in caplog.records:
        if r.name == GUARD_LOG and r.levelno == logging.ERROR and "mismatch:" in r.getMessage():
            field, sid, row = r.args[0], r.args[1], r.args[2]
            out.append((field, sid, row))
    return out


# --------------------------------------------------------------------------- the matrix

N = 8
IDS = [f"s{i}" for i in range(N)]
TENSOR_FIELDS = ["fp32", "bf16", "fp8", "mask", "ids64", "tok", "adv", "shaped", "odd32", "odd16",
                 "pm1"]


def batch(seed=0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    tok_rows = [torch.randperm(1000, generator=g)[: 3 + (i * 5) % 9] for i in range(N)]
    return TensorDict({
        "fp32": torch.randn(N, 6, generator=g),
        "bf16": torch.randn(N, 6, generator=g).to(torch.bfloat16),
        "fp8": torch.randn(N, 6, generator=g).to(torch.float8_e4m3fn),
        "mask": torch.rand(N, 7, generator=g) > 0.5,
        "ids64": torch.randint(0, 1 << 40, (N, 5), generator=g),
        "tok": torch.nested.nested_tensor(tok_rows, layout=torch.jagged),
        # GRPO advantages: one scalar repeated over an even number of tokens
        "adv": torch.randn(N, 1, generator=g).expand(N, 8).contiguous(),
        "shaped": torch.randn(N, 4, 8, generator=g),
        "odd32": torch.randn(N, 5, generator=g),  # odd-length rows, fp32 and bf16
        "odd16": torch.randn(N, 7, generator=g).to(torch.bfloat16),
        "pm1": torch.where(torch.rand(N, 8, generator=g) > 0.5, 1.0, -1.0),  # +-1 advantages
        "meta": NonTensorStack(*[f"prompt {i}" for i in range(N)]),
    }, batch_size=[N])


def _flip_bits(t: torch.Tensor, index: int) -> torch.Tensor:
    t = t.clone()
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    t.view(width).view(-1)[index] ^= 1
    return t


def _swap(t: torch.Tensor, i: int, j: int) -> torch.Tensor:
    t = t.clone()
    t[i], t[j] = t[j].clone(), t[i].clone()
    return t


def _all_rows(rows, field, fn):
    for sid in IDS:
        rows[sid][(field,)] = fn(rows[sid][(field,)])


def _whole_row(rows, dst, src):
    rows[dst] = dict(rows[src])


def _swap_rows(rows, a, b):
    rows[a], rows[b] = rows[b], rows[a]


EVERY_FIELD = TENSOR_FIELDS
MATRIX = {
    # name: (corrupt(rows), {(field, sample id)} expected to mismatch)
    "fp32 one element": (lambda r: r["s3"].__setitem__(("fp32",), _flip_bits(r["s3"][("fp32",)], 2)),
                         {("fp32", "s3")}),
    "bf16 one element": (lambda r: r["s2"].__setitem__(("bf16",), _flip_bits(r["s2"][("bf16",)], 5)),
                         {("bf16", "s2")}),
    "float8_e4m3fn one element": (
        lambda r: r["s4"].__setitem__(("fp8",), _flip_bits(r["s4"][("fp8",)], 0)), {("fp8", "s4")}),
    "bool one element": (lambda r: r["s5"].__setitem__(("mask",), _flip_bits(r["s5"][("mask",)], 3)),
                         {("mask", "s5")}),
    "int64 one element": (lambda r: r["s0"].__setitem__(("ids64",), r["s0"][("ids64",)] + torch.tensor([0, 0, 0, 1 << 33, 0])),
                          {("ids64", "s0")}),
    "truncated jagged row": (lambda r: r["s6"].__setitem__(("tok",), r["s6"][("tok",)][:-1].clone()),
                             {("tok", "s6")}),
    "zero-padded jagged row": (
        lambda r: r["s1"].__setitem__(("tok",), torch.cat([r["s1"][("tok",)], torch.zeros(1, dtype=torch.int64)])),
        {("tok", "s1")}),
    "zero-padded dense row": (
        lambda r: r["s1"].__setitem__(("fp32",), torch.cat([r["s1"][("fp32",)], torch.zeros(2)])),
        {("fp32", "s1")}),
    "zeroed row": (lambda r: r["s7"].__setitem__(("fp32",), torch.zeros(6)), {("fp32", "s7")}),
    "bf16 -> fp32, equal values": (lambda r: _all_rows(r, "bf16", lambda t: t.float()),
                                   {("bf16", s) for s in IDS}),
    "same-width dtype change": (lambda r: _all_rows(r, "fp32", lambda t: t.view(torch.int32).clone()),
                                {("fp32", s) for s in IDS}),
    "reshape (4, 8) -> (32,)": (lambda r: _all_rows(r, "shaped", lambda t: t.reshape(32).clone()),
                                {("shaped", s) for s in IDS}),
    "row served from another sample": (lambda r: _whole_row(r, "s3", "s5"),
                                       {(f, "s3") for f in EVERY_FIELD}),
    "two rows swapped between shards": (lambda r: _swap_rows(r, "s1", "s6"),
                                        {(f, s) for f in EVERY_FIELD for s in ("s1", "s6")}),
    "permutation inside a dense row": (lambda r: r["s2"].__setitem__(("fp32",), _swap(r["s2"][("fp32",)], 0, 4)),
                                       {("fp32", "s2")}),
    "permutation inside a jagged row": (lambda r: r["s3"].__setitem__(("tok",), _swap(r["s3"][("tok",)], 0, 2)),
                                        {("tok", "s3")}),
    "even-length constant row zeroed": (lambda r: r["s4"].__setitem__(("adv",), torch.zeros(8)),
                                        {("adv", "s4")}),
    "fp32 row negated, even length": (lambda r: _negate(r, "s2", "fp32"), {("fp32", "s2")}),
    "fp32 row negated, odd length": (lambda r: _negate(r, "s5", "odd32"), {("odd32", "s5")}),
    "bf16 row negated, even length": (lambda r: _negate(r, "s1", "bf16"), {("bf16", "s1")}),
    "bf16 row negated, odd length": (lambda r: _negate(r, "s6", "odd16"), {("odd16", "s6")}),
    "constant row negated": (lambda r: _negate(r, "s0", "adv"), {("adv", "s0")}),
    "two sign bits flipped in one row": (
        lambda r: r["s7"].__setitem__(("fp32",), r["s7"][("fp32",)] * torch.tensor(
            [1.0, -1, 1, 1, -1, 1])), {("fp32", "s7")}),
    "+-1.0 changed only in exponent bits": (
        lambda r: r["s3"].__setitem__(("pm1",), r["s3"][("pm1",)] * torch.tensor(
            [1.0, 1, 2, 1, 1, 0.5, 1, 1])), {("pm1", "s3")}),
}


def _negate(rows, sid, field):
    rows[sid][(field,)] = -rows[sid][(field,)]


@pytest.mark.parametrize("mode", list(MATRIX))
def test_corruption_matrix(guarded, caplog, mode):
    tel, client, store = guarded
    corrupt, expected = MATRIX[mode]
    caplog.set_level(logging.INFO, logger=GUARD_LOG)
    client.put_samples(IDS, "train", batch())
    corrupt(store._rows["train"])  # between the writer's put and the reader's get
    if mode == "two rows swapped between shards":
        out = [client.get_samples(IDS[:4], "train"), client.get_samples(IDS[4:], "train")]
        positions = {s: i % 4 for i, s in enumerate(IDS)}
    else:
        out = [client.get_samples(IDS, "train")]
        positions = {s: i for i, s in enumerate(IDS)}
    for td in out:
        assert not any(k.startswith(DIGEST_PREFIX) for k in td.keys())
    m = metrics(tel)
    got = set((f, s) for f, s, _ in mismatch_records(caplog))
    assert got == expected, mode
    for f, s, row in mismatch_records(caplog):
        assert row == positions[s]  # the row index within the read
    want = {}
    for f, _ in expected:
        want[f] = want.get(f, 0) + 1
    assert by_field(m, "dpobs_guard_rows_mismatched_total") == want
    assert by_field(m, "dpobs_guard_rows_checked_total") == {f: N for f in TENSOR_FIELDS}
    assert total(m, "dpobs_guard_rows_unverified_total") == 0
    assert total(m, "dpobs_guard_failures_total") == 0
    # totals() (what per-step loggers read) says what the scrape says
    t = tel.guard.totals()
    assert {f: v for f, v in t["mismatched"].items() if v} == want
    assert t["checked"] == {f: N for f in TENSOR_FIELDS}
    assert t["recorded"] == {f: N for f in TENSOR_FIELDS}
    assert t["skipped"] == {"non_tensor": 1 + len(out)} and t["unverified"] == {} and t["failures"] == {}


def test_matrix_modes_an_xor_fold_misses():
    """Two of the matrix's modes pass a torch.hash_tensor XOR fold untouched."""
    g = torch.Generator().manual_seed(0)
    adv = torch.full((8,), 0.75)
    assert int(torch.hash_tensor(adv.view(torch.int32))) == int(
        torch.hash_tensor(torch.zeros(8).view(torch.int32)))
    tok = torch.randperm(1000, generator=g)[:6]
    assert int(torch.hash_tensor(tok)) == int(torch.hash_tensor(_swap(tok, 0, 2)))


def test_mismatch_line_names_field_sample_row_and_length(guarded, caplog):
    tel, client, store = guarded
    caplog.set_level(logging.INFO, logger=GUARD_LOG)
    client.put_samples(IDS, "train", batch())
    store._rows["train"]["s5"][("tok",)] = store._rows["train"]["s5"][("tok",)][:-2].clone()
    client.get_samples(IDS[::-1], "train", ["tok"])
    lines = [r.getMessage() for r in caplog.records if "mismatch:" in r.getMessage()]
    n5 = 3 + (5 * 5) % 9 - 2
    assert lines == [f"dpobs wire guard: fingerprint mismatch: field=tok sample_id=s5 row=2 "
                     f"row_len={n5} partition=train"]


def test_every_row_mismatched_says_likely_a_guard_bug(guarded, caplog):
    tel, client, store = guarded
    caplog.set_level(logging.INFO, logger=GUARD_LOG)
    client.put_samples(IDS, "train", batch())
    _all_rows(store._rows["train"], "fp32", lambda t: t + 1)
    client.get_samples(IDS, "train", ["fp32"])
    warn = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warn) == 1 and "every one of the 8 rows" in warn[0]
    assert "bug in the check" in warn[0]
    caplog.clear()
    client.get_samples(IDS, "train", ["bf16"])  # a clean read says nothing
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# --------------------------------------------------------------------------- the soak


def _rows_td(rows_by_field: dict, ids: list[str]) -> TensorDict:
    out = TensorDict({}, batch_size=[len(ids)])
    for name, rows in rows_by_field.items():
        sel = [rows[s] for s in ids]
        if name == "meta":
            out.set(name, NonTensorStack(*sel))
        elif name == "sub":
            out.set(name, TensorDict({"x": torch.stack(sel)}, batch_size=[len(ids)]))
        elif all(r.shape == sel[0].shape for r in sel) and random.random() < 0.5:
            out.set(name, torch.stack(sel))
        else:
            out.set(name, torch.nested.nested_tensor(sel, layout=torch.jagged))
    return out


def _random_groups(ids: list[str], rng: random.Random) -> list[list[str]]:
    kind = rng.choice(["one", "singletons", "halves", "random"])
    if kind == "singletons" and len(ids) > 24:  # keep the call count (and the run) sane
        kind = "random"
    if kind == "one":
        return [ids]
    if kind == "singletons":
        return [[s] for s in ids]
    if kind == "halves":
        h = max(1, len(ids) // 2)
        return [ids[:h], ids[h:]] if ids[h:] else [ids]
    out, i = [], 0
    while i < len(ids):
        k = rng.randint(1, max(1, len(ids) - i))
        out.append(ids[i:i + k])
        i += k
    return out


def test_soak_no_false_alarm(guarded):
    tel, client, store = guarded
    rng = random.Random(1234)
    torch.manual_seed(1234)
    rows_put = reads = 0
    rounds = 0
    while rows_put < 10_000:
        rounds += 1
        part = f"p{rounds % 7}"
        n = rng.randint(1, 400)
        ids = [f"r{rounds}-{rng.getrandbits(40):x}" for _ in range(n)]
        uniform = rng.random() < 0.3
        L = rng.randint(1, 40)
        rows = {
            "tok": {s: torch.randint(0, 50_000, (L if uniform else rng.randint(0, 40),)) for s in ids},
            "logp": {s: torch.randn(L).to(torch.bfloat16) for s in ids},
            "adv": {s: torch.full((L,), rng.uniform(-1, 1)) for s in ids},
            "mask": {s: torch.rand(rng.randint(1, 9)) > 0.5 for s in ids},
            "fp8": {s: torch.randn(3).to(torch.float8_e4m3fn) for s in ids},
            "sub": {s: torch.randint(0, 9, (2,), dtype=torch.int32) for s in ids},
            "meta": {s: f"m{rng.random()}" for s in ids},
        }
        for group in _random_groups(ids, rng):  # every shard grouping on write
            client.put_samples(group, part, _rows_td(rows, group))
        rows_put += n
        if rng.random() < 0.5:  # a delta write: overwrite one field, add another
            subset = rng.sample(ids, rng.randint(1, n))
            field = rng.choice(["adv", "logp", "tok"])
            for s in subset:
                rows[field][s] = torch.randn(L).to(rows[field][s].dtype) if field != "tok" \
                    else torch.randint(0, 9, (rng.randint(0, 12),))
            client.put_samples(subset, part, _rows_td({field: rows[field]}, subset))
        for _ in range(3):  # reads: every shard grouping, reversed order, field subsets
            order = ids[::-1] if rng.random() < 0.5 else rng.sample(ids, n)
            select = None if rng.random() < 0.3 else rng.sample(
                ["tok", "logp", "adv", "mask", "fp8", "meta"], rng.randint(1, 5))
            for group in _random_groups(order, rng):
                td = client.get_samples(group, part, select)
                reads += 1
                assert not any(str(k).startswith(DIGEST_PREFIX) for k in td.keys())
        client.clear_samples(ids, part)
    m = metrics(tel)
    checked = total(m, "dpobs_guard_rows_checked_total")
    assert rows_put >= 10_000 and checked > 3 * rows_put
    assert total(m, "dpobs_guard_rows_mismatched_total") == 0
    assert total(m, "dpobs_guard_rows_unverified_total") == 0
    assert total(m, "dpobs_guard_failures_total") == 0
    assert total(m, "dpobs_guard_fields_skipped_total") == total(
        m, "dpobs_guard_fields_skipped_total", reason="non_tensor")


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
    client.put_samples(IDS[:4], "mix", batch()[:4].exclude("tok"))
    store.put_samples(IDS[4:], "mix", batch()[4:].exclude("tok"))  # around the guard
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
    from conftest import scrape, value
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
