"""The one-pass C kernel (guard/kernel.py) against the specification's weighted sum and the
torch kernels, on the edges a vectorised loop gets wrong: every tail length past its 32-word
steps, rows that start anywhere in the buffer, strided rows, ranges spread over threads."""
from __future__ import annotations

import pytest
import torch

from dpobs_otel.guard import kernel, sums
from dpobs_otel.guard.reference import weighted_sum


@pytest.fixture(autouse=True)
def built():
    assert kernel.LIB is not None, "the guard's C kernel was not built (setup.py)"


def words(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, generator=g)


def spec(row: torch.Tensor) -> int:
    """The specification's A of one row, as the signed int32 the kernels return."""
    a = weighted_sum([w & 0xFFFFFFFF for w in row.tolist()])
    return a - (1 << 32) if a >> 31 else a


def torch_sums_flat(w, woff, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(kernel, "LIB", None)
        return sums.sums_flat(w, woff)


def test_every_tail_length_and_start_equals_the_specification(monkeypatch):
    lengths = list(range(0, 100)) + [255, 256, 257, 1000]
    woff = torch.tensor([3] + lengths, dtype=torch.int64).cumsum(0)  # rows start at word 3
    w = words(int(woff[-1]) + 5, 1)
    got = kernel.sums_flat(w, woff)
    assert got.tolist() == [spec(w[a:b]) for a, b in zip(woff[:-1].tolist(), woff[1:].tolist())]
    assert torch.equal(got, torch_sums_flat(w, woff, monkeypatch))


def test_dense_rows_with_a_stride_equal_the_specification():
    full = words(37 * 70, 2).view(37, 70)
    for m in (0, 1, 31, 32, 33, 65, 70):
        view = full[:, :m]  # rows of m words, 70 apart
        assert kernel.usable(view)
        got = kernel.sums_dense(view)
        assert got.tolist() == [spec(r) for r in view.unbind(0)], m


def test_a_field_spread_over_threads_equals_one_call(monkeypatch):
    lengths = torch.randint(0, 300, (400,), generator=torch.Generator().manual_seed(3))
    woff = torch.zeros(401, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=woff[1:])
    w = words(int(woff[-1]), 4)
    dense = words(400 * 50, 5).view(400, 50)
    one = kernel.sums_flat(w, woff), kernel.sums_dense(dense)
    calls = []
    real = kernel.LIB

    class Counting:  # the library's two entry points, each call's row range seen
        def dpobs_sums_flat(self, *a):
            calls.append(("flat", a[3], a[4]))
            return real.dpobs_sums_flat(*a)

        def dpobs_sums_dense(self, *a):
            calls.append(("dense", a[3], a[4]))
            real.dpobs_sums_dense(*a)

    monkeypatch.setattr(kernel, "PIECE_WORDS", 1000)
    monkeypatch.setattr(kernel, "LIB", Counting())
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        spread = kernel.sums_flat(w, woff), kernel.sums_dense(dense)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(spread[0], one[0]) and torch.equal(spread[1], one[1])
    for name in ("flat", "dense"):  # many ranges, covering every row once, in any order
        ranges = sorted((a, b) for n, a, b in calls if n == name)
        assert len(ranges) > 10
        assert [a for a, _ in ranges[1:]] == [b for _, b in ranges[:-1]]
        assert ranges[0][0] == 0 and ranges[-1][1] == 400


def test_offsets_outside_the_buffer_are_refused_not_read(monkeypatch):
    w = words(10, 6)
    for bad in ([0, 11], [-1, 4], [0, 6, 4]):
        with pytest.raises(ValueError, match="offsets"):
            kernel.sums_flat(w, torch.tensor(bad))
    monkeypatch.setattr(kernel, "PIECE_WORDS", 4)  # spread: each range checks its own rows
    with pytest.raises(ValueError, match="offsets"):
        kernel.sums_flat(words(64, 6), torch.tensor([0, 8, 16, 24, 32, 40, 48, 56, 65]))


def test_what_it_cannot_read_goes_to_the_torch_kernels():
    assert not kernel.usable(words(8, 7).to(torch.int64))
    assert not kernel.usable(words(16, 7).view(4, 4).t())  # columns: rows not contiguous
    assert not kernel.usable(words(16, 7)[::2])
    assert kernel.usable(words(16, 7)) and kernel.usable(words(16, 7).view(4, 4))
