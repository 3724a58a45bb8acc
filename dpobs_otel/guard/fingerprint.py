"""The row fingerprint of reference.py, vectorised: the words of every row of a field laid
out for the kernels in sums.py, and the salts that finish each row's digest.

  * Dense (N, ...) fields are an (N, m) word matrix: a view of the bytes when the row length
    is a multiple of 4 bytes, else one zero-padded copy.
  * Jagged fields are their packed values buffer with word offsets per row. Rows whose byte
    length is not a multiple of 4 (jagged bool, bf16, ...) are re-laid out on their own
    zero-padded words with one vectorised scatter; narrowed and strided nested tensors go
    through a per-row path. Both evaluate the same polynomial over the same words, so a field
    written jagged and read back dense (its rows happened to be uniform), or the other way
    round, reconciles.
"""
from __future__ import annotations

import zlib
from typing import Sequence

import torch

from ..shims import torch_jagged
from . import kernel, sums
from .reference import G, M32, field_salt, id_salt_prefix
from .sums import sums_dense, sums_flat

__all__ = ["field_digests", "id_salts", "to_device", "UnsupportedField"]


class UnsupportedField(Exception):
    """A tensor the fingerprint cannot read (sparse, quantized, meta, odd nested layout)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# ----------------------------------------------------------------------------- words


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """A host tensor copied to `device` without the host waiting: from pinned memory, queued
    on the current stream (a copy from pageable memory makes CUDA wait for the stream)."""
    device = torch.device(device)
    if device.type == "cpu":
        return t
    if device.type == "cuda" and torch.cuda.is_available():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    # clone, not .contiguous(): the same copy, and one FakeTensorMode runs on a CPU build
    return t if t.is_contiguous() else t.clone(memory_format=torch.contiguous_format)


def _as_bytes_2d(t: torch.Tensor) -> torch.Tensor:
    """(N, ...) tensor -> (N, row_bytes) uint8 view of its exact bits (copy only if needed)."""
    t = _contiguous(t.detach())
    t = t.reshape(t.shape[0], -1)
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def _bytes_to_words_2d(b: torch.Tensor) -> torch.Tensor:
    """(N, nbytes) uint8 -> (N, ceil(nbytes/4)) int32, zero-padded."""
    n, nbytes = b.shape
    m = (nbytes + 3) // 4
    if m == 0:
        return torch.zeros((n, 0), dtype=torch.int32, device=b.device)
    if nbytes % 4:
        pad = torch.zeros((n, m * 4 - nbytes), dtype=torch.uint8, device=b.device)
        b = torch.cat([b, pad], 1)
    elif b.storage_offset() % 4 or (n > 1 and b.stride(0) != nbytes):
        b = b.clone(memory_format=torch.contiguous_format)
    return b.view(torch.int32)


def _words_of_rows(rows: Sequence[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Fallback for layouts with no packed buffer: pad each row's bytes to words, concatenate."""
    parts, offs = [], [0]
    for row in rows:
        w = _bytes_to_words_2d(_as_bytes_2d(row.reshape(1, -1))).reshape(-1)
        parts.append(w)
        offs.append(offs[-1] + w.numel())
    words = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int32, device=device)
    return words, to_device(torch.tensor(offs, dtype=torch.int64), device)


def _relaid_words(values, offsets, unit, esize):
    """Rows ending mid-word: each row re-laid on its own zero-padded run of words, in one
    vectorised scatter of elements (esize is 1 or 2 here: wider elements are aligned)."""
    int_dtype = torch.uint8 if esize == 1 else torch.int16
    per_word = 4 // esize
    src = values.reshape(-1)
    if src.dtype != int_dtype:
        src = src.view(int_dtype)
    lead = offsets[1:] - offsets[:-1]
    n_elem = lead * unit
    m = (n_elem + per_word - 1) // per_word
    woff = torch.zeros(m.numel() + 1, dtype=torch.int64, device=values.device)
    torch.cumsum(m, 0, out=woff[1:])
    shift = woff[:-1] * per_word - offsets[:-1] * unit
    first, last = int(offsets[0]) * unit, int(offsets[-1]) * unit
    elem = src[first:last]
    dst_idx = torch.arange(first, last, dtype=torch.int64, device=values.device)
    dst_idx += torch.repeat_interleave(shift, n_elem, output_size=elem.numel())
    dst = torch.zeros(int(woff[-1]) * per_word, dtype=int_dtype, device=values.device)
    dst[dst_idx] = elem
    return dst.view(torch.int32), woff


_WORKING = {1: torch.uint8, 2: torch.int16, 4: torch.int32}  # element bytes -> a plain int


def _scattered_words(values, starts, lead, unit):
    """Rows of a jagged buffer, row r being lead[r] leading entries from entry starts[r], each
    laid on its own zero-padded words: (words, word offsets). One scatter of every element of
    the buffer, with no host sync: the buffer is sized from host metadata (the values' length
    and the row count), every element outside a row goes to a slot past the last row's words.
    The accelerators' path (narrowed rows too); the CPU's is _relaid_words."""
    esize = values.element_size()
    wsize = min(esize, 4)  # 8-byte elements go as two int32 each
    per_word, scale = 4 // wsize, unit * (esize // wsize)  # working elements per leading entry
    src = values.reshape(-1).view(_WORKING[wsize])
    n, dev = lead.numel(), values.device
    first = starts * scale
    n_elem = lead * scale
    woff = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    torch.cumsum(torch.div(n_elem + (per_word - 1), per_word, rounding_mode="floor"), 0,
                 out=woff.narrow(0, 1, n))
    room = src.numel() + n * (per_word - 1)  # every row's elements and padding fit below this
    room += (-room) % per_word
    pos = torch.arange(src.numel(), device=dev)
    row = (torch.searchsorted(first, pos, right=True) - 1).clamp_(min=0)
    within = pos - torch.gather(first, 0, row)
    dst_idx = torch.gather(woff, 0, row) * per_word + within
    keep = (within >= 0) & (within < torch.gather(n_elem, 0, row)) & (dst_idx < room)
    dst = torch.zeros(room + per_word, dtype=src.dtype, device=dev)  # one spare word: the slot
    dst.index_put_((torch.where(keep, dst_idx, room),), src)
    return dst.view(torch.int32), woff


def _jagged_words_on_device(nt, values, offsets, inner):
    """_jagged_words for an accelerator's tensor: the values buffer itself when every row is
    a whole number of words, else the rows scattered onto their own words; never a sync."""
    n = offsets.shape[0] - 1
    offsets = offsets.to(torch.int64)
    starts = offsets.narrow(0, 0, n)
    lengths = torch_jagged.lengths(nt)
    lead = lengths.to(torch.int64) if lengths is not None else offsets.narrow(0, 1, n) - starts
    unit = 1
    for d in inner:
        unit *= int(d)
    esize = values.element_size()
    values = _contiguous(values.detach())
    if lengths is None and (unit * esize) % 4 == 0:
        flat = values.reshape(-1).view(torch.uint8)
        if flat.storage_offset() % 4:
            flat = flat.clone()
        return flat.view(torch.int32), offsets * (unit * esize // 4), lead, inner
    words, woff = _scattered_words(values, starts, lead, unit)
    return words, woff, lead, inner


def _jagged_words(nt: torch.Tensor):
    """(words, word offsets, per-row leading lengths, inner shape) of a jagged nested tensor."""
    values, offsets = torch_jagged.values(nt), torch_jagged.offsets(nt)
    inner = tuple(values.shape[1:])
    if sums.one_chunk(values.device) and torch_jagged.ragged_dim(nt) == 1:
        return _jagged_words_on_device(nt, values, offsets, inner)
    if not torch_jagged.tiles_values(nt):
        rows = nt.unbind()
        if rows:
            inner = tuple(rows[0].shape[1:])
            if any(r.dim() == 0 or tuple(r.shape[1:]) != inner for r in rows):
                raise UnsupportedField("unsupported_layout")  # ragged past the leading dim
        lead = torch.tensor([r.shape[0] for r in rows], dtype=torch.int64)
        words, woff = _words_of_rows(rows, values.device)
        return words, woff, lead.to(values.device), inner
    offsets = offsets.to(torch.int64)
    lead = offsets[1:] - offsets[:-1]
    unit = 1
    for d in inner:
        unit *= int(d)
    esize = values.element_size()
    values = _contiguous(values.detach())
    if (unit * esize) % 4:
        words, woff = _relaid_words(values, offsets, unit, esize)
        return words, woff, lead, inner
    # Every row is a whole number of words: the values buffer is the word buffer.
    flat = values.reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    if flat.storage_offset() % 4:
        flat = flat.clone()
    return flat.view(torch.int32), offsets * (unit * esize // 4), lead, inner


# ----------------------------------------------------------------------------- digests


def id_salts(sample_ids: Sequence[str], partition_id: str, device="cpu") -> torch.Tensor:
    """I per row, as an int64 tensor (values in [0, 2^32)) on `device`: reference.id_salt,
    with the CRC of the common prefix computed once and continued per id."""
    prefix = zlib.crc32(id_salt_prefix(partition_id))
    vals = [zlib.crc32(str(sid).encode("utf-8", "surrogatepass"), prefix) for sid in sample_ids]
    return to_device(torch.tensor(vals, dtype=torch.int64), device)


def _finish(acc: torch.Tensor, field: str, dtype, row_shape, lead, ids: torch.Tensor):
    """digest = A + (I xor (F + L*G)) mod 2^32, as int64 in [0, 2^32).

    For a fixed sample, A -> digest is a bijection and (F, L) -> salt is injective in L, so a
    change to the words or to the leading length always moves the digest; for fixed words,
    a different id salt always moves it (xor with I is a bijection)."""
    f = field_salt(field, dtype, row_shape)
    done = kernel.finish(acc, ids, lead, f)
    if done is not None:
        return done
    acc = acc.to(torch.int64)  # signed: the final mask makes (A + S) mod 2^32 all the same
    ids = ids.to(acc.device)
    if isinstance(lead, torch.Tensor):
        fl = (lead.to(acc.device) * G + f).bitwise_and_(M32)
        salt = torch.bitwise_xor(fl, ids)
    else:
        salt = torch.bitwise_xor(ids, (int(lead) * G + f) & M32)
    return acc.add_(salt).bitwise_and_(M32)


def _uniform_dense(nt: torch.Tensor) -> torch.Tensor | None:
    """A jagged tensor whose rows all have one length, as the dense (N, L, ...) view of its
    values, else None. Its digests are the same (the salt holds only the shape past the
    leading dim, the leading length enters through G either way), and the dense kernel is far
    faster: stores such as TransferQueue hand dense fields back jagged."""
    if not torch_jagged.tiles_values(nt):
        return None
    off = torch_jagged.offsets(nt)
    n = off.shape[0] - 1
    if n <= 0:
        return None
    lead = off[1:] - off[:-1]
    length = int(lead[0])
    if length == 0 or not bool((lead == length).all()):
        return None
    start = int(off[0])
    values = torch_jagged.values(nt)
    return values[start:start + n * length].reshape(n, length, *values.shape[1:])


def _jagged_digests(value: torch.Tensor, field: str, ids: torch.Tensor) -> torch.Tensor:
    # its attributes, not the nested tensor's (torch_jagged.is_jagged)
    values = torch_jagged.values(value)
    if values.is_quantized or values.device.type == "meta":
        raise UnsupportedField("unsupported_layout")
    # the uniform check reads the offsets: the CPU's shortcut, never an accelerator's sync
    dense = None if sums.one_chunk(values.device) else _uniform_dense(value)
    if dense is not None:
        return field_digests(dense, field, ids)
    words, woff, lead, inner = _jagged_words(value)
    return _finish(sums_flat(words, woff), field, values.dtype, (0,) + inner, lead, ids)


def _strided_nested_digests(value: torch.Tensor, field: str, ids: torch.Tensor) -> torch.Tensor:
    if value.layout != torch.strided:
        raise UnsupportedField("unsupported_layout")
    rows = value.unbind()
    inner = tuple(rows[0].shape[1:]) if rows else ()
    if rows and any(tuple(r.shape[1:]) != inner or r.dim() == 0 for r in rows):
        raise UnsupportedField("unsupported_layout")
    lead = to_device(torch.tensor([r.shape[0] for r in rows], dtype=torch.int64), value.device)
    words, woff = _words_of_rows(rows, value.device)
    # the leading length enters per row through `lead`
    return _finish(sums_flat(words, woff), field, value.dtype, (0,) + inner, lead, ids)


def field_digests(value: torch.Tensor, field: str, ids: torch.Tensor) -> torch.Tensor:
    """The (N,) int64 digests of every row of one tensor field (dense or nested).

    `ids` is `id_salts(...)` for the same rows. Raises UnsupportedField for layouts the
    fingerprint cannot read; the guard counts those as skipped.
    """
    if not isinstance(value, torch.Tensor):
        raise UnsupportedField("non_tensor")
    if torch_jagged.is_jagged(value):
        return _jagged_digests(value, field, ids)
    if value.is_quantized or value.device.type == "meta":
        raise UnsupportedField("unsupported_layout")
    if value.is_nested:
        return _strided_nested_digests(value, field, ids)
    if value.layout != torch.strided:
        raise UnsupportedField("unsupported_layout")
    if value.dim() == 0:
        raise UnsupportedField("no_batch_dim")
    if value.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=value.device)
    row_shape = tuple(value.shape[1:])
    acc = sums_dense(_bytes_to_words_2d(_as_bytes_2d(value)))
    return _finish(acc, field, value.dtype, row_shape, row_shape[0] if row_shape else 0, ids)
