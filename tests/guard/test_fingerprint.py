"""The row fingerprint: the vectorised code equals the plain-Python specification on every
dtype and layout, and it sees what an XOR fold cannot."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torch.utils._python_dispatch import TorchDispatchMode

from dpobs_otel.shims import torch_jagged
from dpobs_otel.guard import fingerprint as fp
from dpobs_otel.guard import reference as spec
from dpobs_otel.guard import pool, sums
from dpobs_otel.guard.fingerprint import field_digests, id_salts
from dpobs_otel.guard.reference import reference_digest

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2,
          torch.bool, torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8,
          torch.float64, torch.complex64]


def rand(shape, dtype, gen=None):
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        info = torch.iinfo(dtype)
        return torch.randint(max(info.min, -1000), min(info.max, 1000), shape, generator=gen,
                             dtype=dtype)
    if dtype == torch.complex64:
        return torch.randn(shape, dtype=torch.complex64, generator=gen)
    return (torch.randn(shape, generator=gen) * 3).to(dtype)


def digests(value, ids, field="f", part="p"):
    return field_digests(value, field, id_salts(ids, part)).tolist()


def reference(rows, ids, field="f", part="p"):
    return [reference_digest(r, field, s, part) for r, s in zip(rows, ids)]


IDS = [f"sample-{i}" for i in range(9)]
pytestmark = pytest.mark.usefixtures("kernel")  # every test on both kernels (conftest.py)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("row_shape", [(), (1,), (3,), (7,), (8,), (4, 3), (2, 0), (5, 2, 3)],
                         ids=str)
def test_dense_equals_reference(dtype, row_shape):
    x = rand((6,) + row_shape, dtype)
    assert digests(x, IDS[:6]) == reference(list(x.unbind(0)), IDS[:6])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("inner", [(), (3,), (2, 2), (8,)], ids=str)
def test_jagged_equals_reference_and_dense(dtype, inner):
    rows = [rand((n,) + inner, dtype) for n in (3, 0, 5, 1, 8, 2)]
    nt = torch.nested.nested_tensor(rows, layout=torch.jagged)
    assert digests(nt, IDS[:6]) == reference(rows, IDS[:6])
    # Written jagged, read back dense (the rows happened to be uniform): same digests.
    uniform = [rand((4,) + inner, dtype) for _ in range(5)]
    as_jagged = torch.nested.nested_tensor(uniform, layout=torch.jagged)
    assert digests(as_jagged, IDS[:5]) == digests(torch.stack(uniform), IDS[:5])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("inner", [(), (3,), (2, 2)], ids=str)
def test_uniform_jagged_takes_the_dense_path_with_the_reference_digests(dtype, inner,
                                                                           monkeypatch):
    uniform = [rand((4,) + inner, dtype) for _ in range(7)]
    nt = torch.nested.nested_tensor(uniform, layout=torch.jagged)
    # A view whose offsets do not start at 0 (rows 2..5 of nt's buffer).
    sliced = torch.nested.nested_tensor_from_jagged(nt.values(), offsets=nt.offsets()[2:7])
    assert fp._uniform_dense(nt) is not None and fp._uniform_dense(sliced) is not None
    fast = digests(nt, IDS[:7]), digests(sliced, IDS[2:6])
    assert fast == (reference(uniform, IDS[:7]), reference(uniform[2:6], IDS[2:6]))
    monkeypatch.setattr(fp, "_uniform_dense", lambda nt: None)  # the general jagged path
    assert (digests(nt, IDS[:7]), digests(sliced, IDS[2:6])) == fast
    ragged = torch.nested.nested_tensor([rand((n,) + inner, dtype) for n in (4, 4, 3)],
                                        layout=torch.jagged)
    monkeypatch.undo()
    assert fp._uniform_dense(ragged) is None


def test_other_layouts_and_views_equal_reference():
    base = torch.arange(60, dtype=torch.int16).view(6, 10)
    narrowed = torch.nested.narrow(base, 1, torch.tensor([0, 1, 0, 2, 3, 9]),
                                   torch.tensor([2, 3, 4, 1, 5, 0]), layout=torch.jagged)
    assert torch_jagged.lengths(narrowed) is not None
    assert digests(narrowed, IDS[:6]) == reference(list(narrowed.unbind()), IDS[:6])
    strided = torch.nested.nested_tensor([torch.randn(3, 2), torch.randn(5, 2)])
    assert digests(strided, IDS[:2]) == reference(list(strided.unbind()), IDS[:2])
    t = torch.randn(5, 7).t()  # non-contiguous
    assert digests(t, IDS[:7]) == reference(list(t.unbind(0)), IDS[:7])
    sliced = torch.randn(40, dtype=torch.float32)[3:].view(37)[:36].view(9, 4)  # odd offset
    assert digests(sliced, IDS) == reference(list(sliced.unbind(0)), IDS)
    offset = torch.nested.nested_tensor_from_jagged(torch.arange(10), torch.tensor([2, 5, 9]))
    assert digests(offset, IDS[:2]) == reference([torch.arange(2, 5), torch.arange(5, 9)],
                                                 IDS[:2])


@pytest.mark.torch_kernel
def test_chunking_does_not_change_digests(monkeypatch):
    rows = [rand((n, 3), torch.bfloat16) for n in (1, 9, 0, 30, 2, 17, 5)]
    nt = torch.nested.nested_tensor(rows, layout=torch.jagged)
    dense = rand((7, 33), torch.float32)
    long_rows = rand((3, 300), torch.int16)  # rows longer than a chunk take the flat path
    before = digests(nt, IDS[:7]), digests(dense, IDS[:7]), digests(long_rows, IDS[:3])
    monkeypatch.setattr(sums, "CPU_CHUNK_WORDS", sums.BLOCK)
    monkeypatch.setattr(sums, "GATHER_ROWS", 2)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):  # one intra-op thread: SERIAL_FACTOR times larger chunks
            torch.set_num_threads(n)
            assert (digests(nt, IDS[:7]), digests(dense, IDS[:7]),
                    digests(long_rows, IDS[:3])) == before
    finally:
        torch.set_num_threads(threads)
    assert before[0] == reference(rows, IDS[:7])
    assert before[2] == reference(list(long_rows.unbind(0)), IDS[:3])


@pytest.mark.torch_kernel
def test_threaded_chunks_equal_one_thread_and_reference(monkeypatch):
    """Several threads share a field's chunks (in any order): same digests as one thread."""
    g = torch.Generator().manual_seed(3)
    rows = [rand((n,), torch.int64, g) for n in torch.randint(0, 40, (120,), generator=g)]
    nt = torch.nested.nested_tensor(rows, layout=torch.jagged)
    dense = rand((120, 9), torch.bfloat16, g)
    ids = [f"s{i}" for i in range(120)]
    monkeypatch.setattr(sums, "CPU_CHUNK_WORDS", sums.BLOCK)
    monkeypatch.setattr(sums, "_workers", lambda n_chunks: 1)
    one = digests(nt, ids), digests(dense, ids)
    monkeypatch.setattr(sums, "_workers", lambda n_chunks: min(3, n_chunks))
    assert (digests(nt, ids), digests(dense, ids)) == one
    assert one[0] == reference(rows, ids)
    assert one[1] == reference(list(dense.unbind(0)), ids)


@pytest.mark.torch_kernel
def test_a_hooks_chunks_spread_over_its_callers_threads_equal_the_reference(monkeypatch):
    """The path a put takes: on a guard helper, spread over the caller's thread count
    (pool.width) through the crew, every dtype width and both kernels."""
    g = torch.Generator().manual_seed(5)
    rows = [rand((n,), torch.int64, g) for n in torch.randint(0, 90, (150,), generator=g)]
    fields = {"tokens": torch.nested.nested_tensor(rows, layout=torch.jagged),
              "bf16": rand((150, 21), torch.bfloat16, g), "mask": rand((150, 13), torch.bool, g)}
    ids = [f"s{i}" for i in range(150)]
    monkeypatch.setattr(sums, "CPU_CHUNK_WORDS", sums.BLOCK)
    spread = []
    real = sums._workers
    monkeypatch.setattr(sums, "_workers", lambda n: spread.append(real(n)) or spread[-1])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        got = {k: pool.run(digests, v, ids, k, where=TensorDict({k: v}, batch_size=[150]))
               for k, v in fields.items()}
    finally:
        torch.set_num_threads(before)
    assert max(spread) == 3  # the caller's three threads, not the helper's one
    assert got["tokens"] == reference(rows, ids, "tokens")
    for k in ("bf16", "mask"):
        assert got[k] == reference(list(fields[k].unbind(0)), ids, k)


@pytest.mark.torch_kernel
def test_threaded_chunks_raise_a_helper_threads_error(monkeypatch):
    monkeypatch.setattr(sums, "_workers", lambda n_chunks: 3)
    seen = []

    def body(i, scratch):
        seen.append(i)
        if i == 5:
            raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        sums._run_chunks(body, 40, lambda: None)
    assert 5 in seen and len(seen) == len(set(seen))  # each chunk at most once


@pytest.mark.torch_kernel
def test_accelerator_single_chunk_path_equals_reference(monkeypatch):
    """The one-chunk, no-host-sync path CUDA takes, exercised on the CPU."""
    monkeypatch.setattr(sums, "one_chunk", lambda device: True)
    rows = [rand((n, 3), torch.bfloat16) for n in (1, 9, 0, 30, 2)]
    assert digests(torch.nested.nested_tensor(rows, layout=torch.jagged), IDS[:5]) == \
        reference(rows, IDS[:5])
    toks = [rand((n,), torch.int64) for n in (4, 0, 7)]
    assert digests(torch.nested.nested_tensor(toks, layout=torch.jagged), IDS[:3]) == \
        reference(toks, IDS[:3])
    offset = torch.nested.nested_tensor_from_jagged(torch.arange(10), torch.tensor([2, 5, 9]))
    assert digests(offset, IDS[:2]) == reference([torch.arange(2, 5), torch.arange(5, 9)],
                                                 IDS[:2])
    dense = rand((7, 33), torch.float32)
    assert digests(dense, IDS[:7]) == reference(list(dense.unbind(0)), IDS[:7])


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(DTYPES), st.lists(st.integers(0, 40), min_size=1, max_size=8),
       st.integers(0, 2 ** 31))
def test_property_jagged_matches_reference(dtype, lengths, seed):
    g = torch.Generator().manual_seed(seed)
    rows = [rand((n,), dtype, g) for n in lengths]
    nt = torch.nested.nested_tensor(rows, layout=torch.jagged)
    ids = [f"id{i}" for i in range(len(rows))]
    assert digests(nt, ids) == reference(rows, ids)


# --------------------------------------------------------------------- sensitivity


def one(row, field="f", sid="s", part="p"):
    return reference_digest(row, field, sid, part)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.sampled_from(DTYPES), st.integers(1, 70), st.integers(0, 2 ** 31), st.data())
def test_any_single_element_change_and_any_swap_is_seen(dtype, n, seed, data):
    """A change inside one 32-bit word is always seen (the mix is a bijection, the weight
    odd); a swap of two different elements is seen unless a 2^-20-or-rarer coincidence holds
    (docs/guard.md), so this runs on fixed examples."""
    g = torch.Generator().manual_seed(seed)
    row = rand((n,), dtype, g)
    i = data.draw(st.integers(0, n - 1))
    changed = row.clone()
    bits = changed.view({1: torch.uint8, 2: torch.int16, 4: torch.int32,
                         8: torch.int64}[row.element_size()])
    bit = data.draw(st.integers(0, 8 * row.element_size() - 1))
    bits.view(-1)[i * max(1, bits.numel() // n)] ^= (1 << bit) if bit < 8 * bits.element_size() - 1 \
        else -(1 << bit)
    assert one(changed) != one(row)
    j = data.draw(st.integers(0, n - 1))
    swapped = row.clone()
    swapped[i], swapped[j] = row[j], row[i]
    same_bits = torch.equal(row[i:i + 1].view(torch.uint8), row[j:j + 1].view(torch.uint8))
    assert (one(swapped) == one(row)) == same_bits


def xor_fold(row: torch.Tensor) -> int:
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[row.element_size()]
    return int(torch.hash_tensor(row.view(width)))


def test_what_an_xor_fold_misses_the_fingerprint_sees():
    # A permutation inside a row.
    row = torch.arange(8, dtype=torch.float32)
    perm = row[[1, 0, 2, 3, 4, 5, 6, 7]]
    assert xor_fold(perm) == xor_fold(row) and one(perm) != one(row)
    # Equal words cancel in pairs: an even-length constant row folds like that row zeroed.
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        for n in (2, 4, 6, 64, 4096):
            const = torch.full((n,), 7 if dtype == torch.int64 else 0.37).to(dtype)
            zero = torch.zeros_like(const)
            assert xor_fold(const) == xor_fold(zero)
            assert one(const) != one(zero), (dtype, n)
    # Zero padding is XOR-neutral; the row shape is in our salt.
    padded = torch.cat([row, torch.zeros(4)])
    assert xor_fold(padded) == xor_fold(row) and one(padded) != one(row)
    # Sign-only swaps at odd positions: top-bit-only differences in the packed words.
    signs = torch.tensor([0.5, 1.0, 0.5, -1.0], dtype=torch.float32)
    assert one(signs[[0, 3, 2, 1]]) != one(signs)
    f64 = torch.tensor([2.0, -2.0, 3.0], dtype=torch.float64)
    assert one(f64[[1, 0, 2]]) != one(f64)


def test_salt_covers_shape_dtype_field_sample_and_partition():
    row = torch.arange(32, dtype=torch.float32)
    base = one(row)
    assert one(row.view(4, 8)) != base  # reshape (32,) -> (4, 8)
    assert one(row.view(torch.int32)) != base  # same width, same bits
    assert one(row.to(torch.bfloat16).float()) != one(row.to(torch.bfloat16))  # bf16 -> fp32
    assert one(row[:31]) != one(torch.cat([row[:31], torch.zeros(1)]))  # one word, padded
    assert one(row, field="g") != base
    assert one(row, sid="t") != base
    assert one(row, part="q") != base
    assert one(row) == base  # and it is a function: same input, same digest
    assert one(torch.zeros(0)) != one(torch.zeros(0, 2))


def _constant(word: int, n_words: int) -> torch.Tensor:
    return torch.full((1, n_words), spec.s32(word), dtype=torch.int32)


def test_constant_rows_never_vanish_or_pass_negated():
    """Deterministic (docs/guard.md): constant rows of n words differ by d * (R^n - 1)/(R - 1)
    with d = mix(a) - mix(b), of 2-adic valuation v2(d) + v2(n) + 1 < 32 here."""
    ids = id_salts(["s"], "p")
    for n_words in (1, 2, 3, 4, 8, 1024, 1 << 15):
        zero = int(field_digests(_constant(0, n_words), "f", ids))
        for word in (1, 0x80000000, 0x40000000, 0x3F800000, 0xFFFFFFFF, 0x80008000, 0xBF80BF80):
            d = int(field_digests(_constant(word, n_words), "f", ids))
            assert d != zero, (n_words, hex(word))
        for x in (0.37, 1.0, -2.5):  # negated: fp32 flips bit 31, a bf16 pair bits 15 and 31
            for dtype in (torch.float32, torch.bfloat16):
                row = torch.full((1, n_words * 4 // dtype.itemsize), x, dtype=dtype)
                assert int(field_digests(row, "f", ids)) != int(field_digests(-row, "f", ids))


def plain_sum(row: torch.Tensor) -> int:
    """What the fingerprint would be without its mix: sum_i w_i R^i mod 2^32."""
    acc, rpow = 0, 1
    for w in spec.row_words(row):
        acc = (acc + w * rpow) & spec.M32
        rpow = (rpow * spec.R) & spec.M32
    return acc


def test_what_a_plain_weighted_sum_misses_the_mix_sees():
    g = torch.Generator().manual_seed(5)
    row = torch.randn(64, generator=g)
    two_signs = row.clone()
    two_signs[[3, 40]] *= -1  # 2^31 (R^3 + R^40) = 0 mod 2^32
    assert plain_sum(two_signs) == plain_sum(row) and one(two_signs) != one(row)
    assert plain_sum(-row) == plain_sum(row) and one(-row) != one(row)  # even length
    odd = row[:63]
    assert one(-odd) != one(odd)
    for n in (64, 63, 66, 65):  # bf16 rows of even and odd length, odd and even word count
        b = torch.randn(n, generator=g).to(torch.bfloat16)
        assert one(-b) != one(b), n
        b2 = b.clone()
        b2[[1, n - 2]] *= -1
        assert one(b2) != one(b), n
    # +-1.0 advantages changed only in exponent bits: 1.0 -> 2.0 and 1.0 -> 0.5, 128 apart,
    # change the plain sum by 2^23 R^3 (1 - R^128) = 0 mod 2^32.
    adv = torch.where(torch.rand(200, generator=g) > 0.5, 1.0, -1.0)
    bent = adv.clone()
    bent[3] *= 2.0
    bent[131] *= 0.5
    assert plain_sum(bent) == plain_sum(adv) and one(bent) != one(adv)
    adv16 = adv.to(torch.bfloat16)
    bent16 = adv16.clone()
    bent16[[5, 77]] *= torch.tensor([4.0, 0.25], dtype=torch.bfloat16)
    assert one(bent16) != one(adv16)


ALLOWED_OPS = {
    "add", "sub", "mul", "mul_", "sub_", "bitwise_xor", "bitwise_and", "bitwise_right_shift",
    "sum", "cumsum", "cumsum_", "index_select", "index", "view", "_unsafe_view", "reshape",
    "slice", "select", "empty", "zeros", "full", "full_like", "fill_", "copy_", "clone",
    "_to_copy", "lift_fresh", "alias", "detach", "t", "expand", "cat", "zero_", "arange",
    "repeat_interleave", "index_put_", "diff", "lift_fresh_copy", "as_strided", "unbind",
    "_local_scalar_dense", "contiguous", "new_empty", "empty_like", "view_as", "squeeze",
    "unsqueeze", "stack", "narrow", "split_with_sizes", "split", "set_", "_to_dtype",
    "add_", "floor_divide", "layout", "where", "roll", "scalar_tensor",
    "bitwise_and_", "bitwise_xor_", "div", "lt", "gather", "clamp_max_",
    "eq", "all",  # the uniform-jagged check: int64 comparisons, which CUDA has
}
UNSIGNED_WIDE = {torch.uint16, torch.uint32, torch.uint64}  # few kernels on CUDA


class _OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops, self.dtypes = set(), set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.add(func.overloadpacket.__name__)
        for t in (out if isinstance(out, (list, tuple)) else [out]):
            if isinstance(t, torch.Tensor):
                self.dtypes.add(t.dtype)
        return out


@pytest.mark.torch_kernel  # the code CUDA runs; the C kernel is the CPU's alone
def test_uses_only_device_safe_int_ops():
    """No unsigned wide tensor is ever produced and only plain int32/int64 arithmetic runs,
    so the same code runs on CUDA (which has no uint32/uint64 xor/mul kernels)."""
    ids = id_salts(IDS[:6], "p")
    dense = rand((6, 5, 3), torch.bfloat16)
    jag = torch.nested.nested_tensor([rand((n,), torch.int64) for n in (1, 4, 0, 9, 2, 3)],
                                     layout=torch.jagged)
    odd = torch.nested.nested_tensor([rand((n,), torch.bool) for n in (1, 4, 0, 9, 2, 3)],
                                     layout=torch.jagged)
    uniform = torch.nested.nested_tensor([rand((4,), torch.bool) for _ in range(6)],
                                         layout=torch.jagged)
    with _OpLog() as log:
        field_digests(dense, "a", ids)
        field_digests(torch_jagged.values(jag).view(1, -1), "b", ids[:1])
        field_digests(odd, "c", ids)
        field_digests(uniform, "d", ids)
    assert not log.dtypes & UNSIGNED_WIDE
    assert log.ops <= ALLOWED_OPS, log.ops - ALLOWED_OPS


def test_layouts_it_cannot_read_are_refused_not_guessed():
    ids = id_salts(IDS[:2], "p")
    ragged_inner = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(2, 5)],
                                              layout=torch.jagged)  # ragged past dim 1
    transposed = torch.nested.nested_tensor([torch.randn(3, 2), torch.randn(5, 2)],
                                            layout=torch.jagged).transpose(1, 2)
    for value, reason in [(ragged_inner, "unsupported_layout"),
                          (transposed, "unsupported_layout"),
                          (torch.zeros(2).to_sparse(), "unsupported_layout"),
                          (torch.tensor(1.0), "no_batch_dim"),
                          ("text", "non_tensor")]:
        with pytest.raises(fp.UnsupportedField) as err:
            field_digests(value, "f", ids)
        assert err.value.reason == reason


def test_ids_that_differ_within_32_bits_never_share_a_salt():
    """I is a CRC-32: ids of one length that differ only within 4 consecutive bytes always
    get different salts (a 32-bit hash would collide among these 10,000 with p ~ 1.2%), and
    the vectorised salts equal the specification's."""
    ids = [f"sample-{i:04d}" for i in range(10_000)]
    salts = id_salts(ids, "train").tolist()
    assert len(set(salts)) == len(ids)
    assert salts[:50] == [spec.id_salt("train", s) for s in ids[:50]]
    assert id_salts(["a"], "p1").tolist() != id_salts(["a"], "p2").tolist()
