"""What each private attribute dpobs_otel.nested reads means on the pinned torch: if an
upgrade changes one, this fails here instead of as wrong byte counts or digests elsewhere."""
from __future__ import annotations

import torch

from dpobs_otel import nested


def _jagged(lengths, inner=(3,), dtype=torch.float32):
    rows = [torch.arange(n * 3, dtype=dtype).reshape(n, *inner) for n in lengths]
    return torch.nested.nested_tensor(rows, layout=torch.jagged), rows


def test_values_pack_every_row_and_offsets_mark_where_each_starts():
    nt, rows = _jagged([2, 0, 5])
    assert torch.equal(nested.values(nt), torch.cat(rows))
    assert nested.offsets(nt).dtype == torch.int64
    assert nested.offsets(nt).tolist() == [0, 2, 2, 7]
    assert nested.lengths(nt) is None and nested.ragged_dim(nt) == 1
    assert nested.tiles_values(nt)
    assert nested.row_lengths(nt).tolist() == [2, 0, 5]


def test_offsets_may_start_past_zero_over_a_shared_buffer():
    # A view over part of a larger buffer (what a store's read may hand back) keeps the
    # buffer whole: rows start at offsets[i], and values is longer than the rows it spans.
    buf = torch.arange(30, dtype=torch.float32).reshape(10, 3)
    nt = torch.nested.nested_tensor_from_jagged(buf, torch.tensor([2, 5, 9]))
    assert nested.offsets(nt).tolist() == [2, 5, 9]
    assert nested.values(nt).data_ptr() == buf.data_ptr() and nested.values(nt).shape[0] == 10
    assert nested.lengths(nt) is None and nested.tiles_values(nt)
    assert nested.row_lengths(nt).tolist() == [3, 4]


def test_narrow_sets_lengths_and_rows_no_longer_tile_the_values():
    base = torch.arange(24, dtype=torch.float32).reshape(3, 8)
    nt = torch.nested.narrow(base, 1, torch.tensor([0, 2, 1]), torch.tensor([3, 4, 2]),
                             layout=torch.jagged)
    assert nested.lengths(nt).tolist() == [3, 4, 2]
    assert not nested.tiles_values(nt)
    assert nested.row_lengths(nt).tolist() == [3, 4, 2]
    for i, (start, n) in enumerate([(0, 3), (2, 4), (1, 2)]):
        off = int(nested.offsets(nt)[i])
        assert off == i * 8 + start  # offsets point into the base, starts included
        assert torch.equal(nested.values(nt)[off:off + n], base[i, start:start + n])


def test_ragged_dim_is_one_for_the_rows_by_length_layout():
    nt, _ = _jagged([1, 2], inner=(3,))
    assert nested.ragged_dim(nt) == 1
    assert nested.ragged_dim(nt.transpose(1, 2)) == 2
    assert not nested.tiles_values(nt.transpose(1, 2))


def test_is_jagged_and_device_tell_a_jagged_tensor_by_its_type():
    nt, _ = _jagged([2, 3])
    strided = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    assert nested.is_jagged(nt) and nt.layout == torch.jagged
    assert not nested.is_jagged(strided) and strided.is_nested
    assert not nested.is_jagged(torch.zeros(2, 3)) and not nested.is_jagged([1, 2])
    assert nested.device(nt) == nt.device == nested.values(nt).device
    assert nested.device(torch.zeros(1, device="meta")).type == "meta"
