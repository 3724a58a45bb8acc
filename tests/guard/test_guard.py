"""The wire guard: a corruption matrix caught and attributed to the right field and row, and a
randomized soak with no false alarm."""
from __future__ import annotations

import logging
import random

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from dpobs_otel.guard import DIGEST_PREFIX
from helpers.guard import (GUARD_LOG, IDS, N, TENSOR_FIELDS, _all_rows, _flip_bits, _swap,
                           _swap_rows, _whole_row, batch, by_field, metrics, mismatch_records,
                           total)
from helpers.rowsel import HOWS, row_numbers, take_rows


pytestmark = pytest.mark.usefixtures("kernel")  # the corruption matrix on both kernels
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


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("subset", [slice(2, 6), [7, 1, 4]], ids=["slice", "picked"])
def test_row_subsets_of_a_jagged_batch_are_checked(guarded, caplog, how, subset):
    # tensordict 0.10 cannot make these subsets itself (helpers/rowsel.py); the digests of a
    # view of a larger batch (offsets[0] > 0) must equal those of the compact rows read back.
    tel, client, store = guarded
    caplog.set_level(logging.INFO, logger=GUARD_LOG)
    full = batch()
    rows = row_numbers(N, subset)
    ids = [IDS[i] for i in rows]
    client.put_samples(ids, "sub", take_rows(full, subset, how))
    out = client.get_samples(ids, "sub")
    truth = full["tok"].unbind()
    assert [r.tolist() for r in out["tok"].unbind()] == [truth[i].tolist() for i in rows]
    assert torch.equal(out["fp32"], full["fp32"][torch.tensor(rows)])
    t = tel.guard.totals()
    assert t["checked"] == {f: len(rows) for f in TENSOR_FIELDS}
    assert sum(t["mismatched"].values()) == 0 and t["failures"] == {}
    sid = ids[1]  # one stored row's tokens changed: the next read names that row alone
    store._rows["sub"][sid][("tok",)] = store._rows["sub"][sid][("tok",)] + 1
    client.get_samples(ids, "sub", ["tok"])
    assert tel.guard.totals()["mismatched"]["tok"] == 1
    assert [(f, s) for f, s, _ in mismatch_records(caplog)] == [("tok", sid)]
