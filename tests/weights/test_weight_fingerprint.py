"""The weight fingerprint: the guard's definition of one row (reference.py) for the whole
tensor, computed in parallel pieces, and what it tells apart that an xor of the bits
(torch.hash_tensor) does not."""
from __future__ import annotations

import pytest
import torch

from dpobs_otel.guard.reference import reference_digest
from dpobs_otel.weights import fingerprint as fp

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8,
          torch.uint8, torch.int64, torch.bool, torch.complex64]


def _ref(name, t):
    return reference_digest(t, name, name, fp.PARTITION)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(5, 7), (3,), (), (2, 3, 5), (0, 4)])
def test_equals_the_specification(path, dtype, shape):
    t = (torch.randn(shape) * 50).to(dtype)
    assert fp.fingerprint("w", t) == _ref("w", t)


@pytest.fixture(params=["kernel in place", "torch kernels"])
def path(request, monkeypatch):
    """Both ways a tensor is read: the C kernel where the bytes lie, the guard's words."""
    if request.param == "torch kernels":
        monkeypatch.setattr(fp.kernel, "LIB", None)
    elif fp.kernel.LIB is None:
        pytest.skip("the C kernel was not built here")
    return request.param


@pytest.mark.parametrize("piece", [1, 3, 7, 64])
def test_pieces_recombine_to_the_one_row_sum(monkeypatch, path, piece):
    monkeypatch.setattr(fp, "MIN_PIECE", piece)
    monkeypatch.setattr(fp.pool, "width", lambda: 4)
    t = torch.randn(9, 13).to(torch.bfloat16)  # 58.5 words: a padded last word too
    assert fp.fingerprint("w", t) == _ref("w", t)
    view = torch.randn(13, 9).t()  # not contiguous
    assert fp.fingerprint("w", view) == _ref("w", view.contiguous())


def _variants(t: torch.Tensor) -> dict[str, torch.Tensor]:
    flipped = t.clone()
    flipped.view(-1)[7] = -flipped.view(-1)[7]
    swapped = t.clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    return {"flipped sign": flipped, "swapped rows": swapped,
            "fp32 upcast": t.to(torch.float32), "reshaped": t.reshape(t.shape[1], t.shape[0])}


def test_every_corruption_moves_it_and_an_xor_misses_two():
    t = torch.randn(8, 16).to(torch.bfloat16)
    base = fp.fingerprint("layer.w", t)
    for what, bad in _variants(t).items():
        assert fp.fingerprint("layer.w", bad) != base, what
    assert fp.fingerprint("other.w", t) != base  # the name is bound in
    # What a bit-xor checksum cannot see: rows swapped, and the shape.
    xor = torch.hash_tensor(t.view(torch.int16).to(torch.int64))
    assert torch.hash_tensor(_variants(t)["swapped rows"].view(torch.int16).to(torch.int64)) == xor
    assert torch.hash_tensor(t.reshape(16, 8).view(torch.int16).to(torch.int64)) == xor


def test_layouts_it_cannot_read_raise_unsupported():
    from dpobs_otel.guard.fingerprint import UnsupportedField
    with pytest.raises(UnsupportedField):
        fp.fingerprint("s", torch.eye(3).to_sparse())
