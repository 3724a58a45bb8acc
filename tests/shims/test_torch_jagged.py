"""What each private attribute dpobs_otel.shims.torch_jagged reads means on the pinned torch: if an
upgrade changes one, this fails here instead of as wrong byte counts or digests elsewhere."""
from __future__ import annotations

import torch

from dpobs_otel.shims import torch_jagged


def _jagged(lengths, inner=(3,), dtype=torch.float32):
    rows = [torch.arange(n * 3, dtype=dtype).reshape(n, *inner) for n in lengths]
    return torch.nested.nested_tensor(rows, layout=torch.jagged), rows


def test_values_pack_every_row_and_offsets_mark_where_each_starts():
    nt, rows = _jagged([2, 0, 5])
    assert torch.equal(torch_jagged.values(nt), torch.cat(rows))
    assert torch_jagged.offsets(nt).dtype == torch.int64
    assert torch_jagged.offsets(nt).tolist() == [0, 2, 2, 7]
    assert torch_jagged.lengths(nt) is None and torch_jagged.ragged_dim(nt) == 1
    assert torch_jagged.tiles_values(nt)
    assert torch_jagged.row_lengths(nt).tolist() == [2, 0, 5]


def test_offsets_may_start_past_zero_over_a_shared_buffer():
    # A view over part of a larger buffer (what a store's read may hand back) keeps the
    # buffer whole: rows start at offsets[i], and values is longer than the rows it spans.
    buf = torch.arange(30, dtype=torch.float32).reshape(10, 3)
    nt = torch.nested.nested_tensor_from_jagged(buf, torch.tensor([2, 5, 9]))
    assert torch_jagged.offsets(nt).tolist() == [2, 5, 9]
    assert torch_jagged.values(nt).data_ptr() == buf.data_ptr() and torch_jagged.values(nt).shape[0] == 10
    assert torch_jagged.lengths(nt) is None and torch_jagged.tiles_values(nt)
    assert torch_jagged.row_lengths(nt).tolist() == [3, 4]


def test_narrow_sets_lengths_and_rows_no_longer_tile_the_values():
    base = torch.arange(24, dtype=torch.float32).reshape(3, 8)
    nt = torch.nested.narrow(base, 1, torch.tensor([0, 2, 1]), torch.tensor([3, 4, 2]),
                             layout=torch.jagged)
    assert torch_jagged.lengths(nt).tolist() == [3, 4, 2]
    assert not torch_jagged.tiles_values(nt)
    assert torch_jagged.row_lengths(nt).tolist() == [3, 4, 2]
    for i, (start, n) in enumerate([(0, 3), (2, 4), (1, 2)]):
        off = int(torch_jagged.offsets(nt)[i])
        assert off == i * 8 + start  # offsets point into the base, starts included
        assert torch.equal(torch_jagged.values(nt)[off:off + n], base[i, start:start + n])


def test_ragged_dim_is_one_for_the_rows_by_length_layout():
    nt, _ = _jagged([1, 2], inner=(3,))
    assert torch_jagged.ragged_dim(nt) == 1
    assert torch_jagged.ragged_dim(nt.transpose(1, 2)) == 2
    assert not torch_jagged.tiles_values(nt.transpose(1, 2))


def test_is_jagged_and_device_tell_a_jagged_tensor_by_its_type():
    nt, _ = _jagged([2, 3])
    strided = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    assert torch_jagged.is_jagged(nt) and nt.layout == torch.jagged
    assert not torch_jagged.is_jagged(strided) and strided.is_nested
    assert not torch_jagged.is_jagged(torch.zeros(2, 3)) and not torch_jagged.is_jagged([1, 2])
    assert torch_jagged.device(nt) == nt.device == torch_jagged.values(nt).device
    assert torch_jagged.device(torch.zeros(1, device="meta")).type == "meta"
