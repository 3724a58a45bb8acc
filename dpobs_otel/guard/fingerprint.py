"""Per-row wire fingerprints: exact, position-dependent, salted, vectorised, device-safe.

The fingerprint of one row of one field is a 64-bit integer (stored as a signed int64):

    bytes   the row's exact bits: every dtype is bit-cast (bool, float8, bf16, complex...),
            the row's bytes are zero-padded to a multiple of 8 and read as little-endian
            64-bit words w_0 .. w_{m-1}
    limbs   each word splits into 32-bit limbs  lo_i = w_i mod 2^32 (unsigned)
                                                hi_i = w_i >> 32     (signed)
    A       a polynomial over the limbs, base R, mod 2^64:
                A = sum_i (lo_i + R*hi_i) * R^(2i)  =  sum_k limb_k * R^k
            computed per word as  y_i = w_i + (R - 2^32) * hi_i ,  A = sum_i y_i * R^(2i)
    salt    S = I xor (F + L*G)
                F  = h64(field name, dtype, row rank, row shape past the leading dim)
                L  = the row's leading length (0 for a scalar row)
                I  = h64(partition id, sample id)
    digest  A + S  (mod 2^64)

h64 is an 8-byte blake2b (stable across processes, unlike hash()), G is the odd 64-bit golden
ratio, R is odd with R = 11 (mod 16). No finaliser: equality of digests is all the guard
compares, and a bijection applied on top would not change which inputs collide.

Why these choices (see docs/guard.md for the arithmetic):
  * A limb difference is smaller than 2^32, so its 2-adic valuation is at most 31; R is odd.
    Hence any change confined to one limb always changes A, two equal limbs never cancel
    (x*(R^a + R^b) has valuation <= 33), and swapping two different limbs a < b changes A by
    (x_b - x_a) * R^a * (1 - R^(b-a)), valuation <= 33 + log2(b-a) < 64: every transposition
    inside a row shorter than 2^30 limbs is detected, deterministically. An XOR fold has none of
    these properties: it is permutation-blind and equal words cancel in pairs.
  * The shape, dtype and field name are in the salt, so zero padding (identical words), a
    reshape (4, 8) -> (32,), a same-width dtype change and bf16 -> fp32 all diverge.
  * The sample and partition ids are in the salt, so a row served from another sample, or two
    rows swapped between shards, diverge even though each carries its own (valid) digest.
  * Only int64 add / multiply / xor / shift / and / sum / cumsum / index are used (logical
    shifts are an arithmetic shift then a mask), so it runs wherever the tensor lives,
    CUDA included; no uint64 arithmetic.
  * The same row gives the same digest whether it arrives as a row of a dense (N, L, ...)
    tensor or of a jagged nested tensor: both evaluate the same polynomial over the same words.
    A jagged field is evaluated over its values buffer with per-row segment sums (cumsum),
    rebasing each row with a table of inverse powers; a dense field is one broadcast multiply
    and a row sum.

`reference_digest` is the same function in plain Python over bytes: the specification the
vectorised code is tested against.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
import threading
from typing import Sequence

import torch

__all__ = [
    "field_digests",
    "id_salts",
    "reference_digest",
    "UnsupportedField",
]

_M64 = (1 << 64) - 1


def _s64(x: int) -> int:
    """A Python int mod 2^64 as the signed int64 with the same bits."""
    x &= _M64
    return x - (1 << 64) if x >> 63 else x


# R = 11 (mod 16): R = 3 (mod 8) so v2(R-1) = 1, v2(R+1) = 2, and v2(R-3) = 3 (docs/guard.md).
_R = 0x9E6C63D0676A9A9B
assert _R % 16 == 11
_R2 = (_R * _R) & _M64
_R2_INV = pow(_R2, -1, 1 << 64)
_K = _s64(_R - (1 << 32))  # y = w + K*hi  ==  lo + R*hi  (mod 2^64)
_G = _s64(0x9E3779B97F4A7C15)

# Words per chunk on the CPU: the working set of one chunk (3 int64 buffers) stays in cache and
# each elementwise op stays under torch's parallel grain size. Accelerators run in one chunk.
CPU_CHUNK_WORDS = 1 << 15
# At most this many threads share the chunks of one field on the CPU (see _run_chunks).
MAX_WORKERS = 4



class UnsupportedField(Exception):
    """A tensor the fingerprint cannot read (sparse, quantized, meta, odd nested layout)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


# ----------------------------------------------------------------------------- scalar helpers


def _h64(*parts: str) -> int:
    data = "\x00".join(parts).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _field_salt(field: str, dtype: torch.dtype, row_shape: Sequence[int]) -> int:
    inner = ",".join(str(int(d)) for d in row_shape[1:])
    return _h64("dpobs-fp-v1", field, str(dtype), str(len(row_shape)), inner)


# ----------------------------------------------------------------------------- tensor helpers


class _PowerTables:
    """R^(2i) and R^(-2i) mod 2^64 for i < n, per device, grown by doubling."""

    def __init__(self):
        self._lock = threading.Lock()
        self._tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    @staticmethod
    def _build(base: int, n: int, device) -> torch.Tensor:
        t = torch.empty(n, dtype=torch.int64, device=device)
        t[0] = 1
        filled = 1
        while filled < n:
            k = min(filled, n - filled)
            torch.mul(t[:k], _s64(pow(base, filled, 1 << 64)), out=t[filled:filled + k])
            filled += k
        return t

    def get(self, n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        key = str(device)
        cur = self._tables.get(key)
        if cur is not None and cur[0].numel() >= n:
            return cur
        with self._lock:
            cur = self._tables.get(key)
            if cur is not None and cur[0].numel() >= n:
                return cur
            size = max(1024, 1 << max(0, n - 1).bit_length())
            cur = (self._build(_R2, size, device), self._build(_R2_INV, size, device))
            self._tables[key] = cur
            return cur


_TABLES = _PowerTables()


def _as_bytes_2d(t: torch.Tensor) -> torch.Tensor:
    """(N, ...) tensor -> (N, row_bytes) uint8 view of its exact bits (copy only if needed)."""
    n = t.shape[0]
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dim() == 1:
        t = t.reshape(n, 1)
    else:
        t = t.reshape(n, -1)
    if t.dtype != torch.uint8:
        t = t.view(torch.uint8)
    return t


def _bytes_to_words_2d(b: torch.Tensor) -> torch.Tensor:
    """(N, nbytes) uint8 -> (N, ceil(nbytes/8)) int64, zero-padded."""
    n, nbytes = b.shape
    m = (nbytes + 7) // 8
    if m == 0:
        return torch.zeros((n, 0), dtype=torch.int64, device=b.device)
    if nbytes % 8 or b.storage_offset() % 8 or (n > 1 and b.stride(0) != nbytes):
        buf = torch.zeros((n, m * 8), dtype=torch.uint8, device=b.device)
        buf[:, :nbytes] = b
        b = buf
    return b.view(torch.int64)


def _one_chunk(device) -> bool:
    """Accelerators take a whole field in one chunk: no host sync, few kernel launches."""
    return torch.device(device).type != "cpu"


def _chunk_words(device) -> int:
    return 1 << 62 if _one_chunk(device) else CPU_CHUNK_WORDS


def _workers(n_chunks: int) -> int:
    """Threads for n_chunks CPU chunks: torch's intra-op thread count (so `--threads 1` or
    torch.set_num_threads(1) keeps it on one core), at most MAX_WORKERS, >= 4 chunks each."""
    return max(1, min(torch.get_num_threads(), MAX_WORKERS, n_chunks // 4))


def _run_chunks(body, n_chunks: int, make_scratch) -> None:
    """body(i, scratch) for every chunk i, each exactly once, in any order; `make_scratch()`
    gives each thread its own scratch buffer.

    On the CPU each chunk stays under torch's parallel grain size, so every op runs on the
    thread that called it: no OpenMP barrier to stall on when the machine is busy (measured: a
    32k-word op that goes parallel on a loaded 2-core box can take 100x longer). Instead, up to
    `_workers()` Python threads (the caller and short-lived helpers, fork-safe: nothing
    persists between calls) pull chunk indices from one shared counter; torch releases the
    GIL inside every op, so they run side by side, and a helper the OS has descheduled delays
    nobody: the others take its chunks. Each chunk writes only its own slice of the output."""
    workers = _workers(n_chunks)
    if workers <= 1:
        scratch = make_scratch()
        for i in range(n_chunks):
            body(i, scratch)
        return
    counter = itertools.count()  # next() on it is atomic under the GIL
    errors: list[BaseException] = []

    def work() -> None:
        try:
            scratch = make_scratch()
            for i in counter:
                if i >= n_chunks or errors:
                    return
                body(i, scratch)
        except BaseException as e:  # re-raised in the caller
            errors.append(e)

    helpers = [threading.Thread(target=work, name="dpobs-fingerprint", daemon=True)
               for _ in range(workers - 1)]
    for t in helpers:
        t.start()
    work()
    for t in helpers:
        t.join()
    if errors:
        raise errors[0]


def _poly_dense(words: torch.Tensor) -> torch.Tensor:
    """A for every row of an (N, m) int64 word matrix."""
    n, m = words.shape
    dev = words.device
    out = torch.zeros(n, dtype=torch.int64, device=dev)
    if n == 0 or m == 0:
        return out
    tpow, _ = _TABLES.get(m, dev)
    tp = tpow[:m]
    step = max(1, _chunk_words(dev) // m)
    w_parts = words.split(step)  # views, made in one call: less Python per chunk
    o_parts = out.split(step)

    def body(c: int, buf: torch.Tensor) -> None:
        w = w_parts[c]
        y = buf if w.shape[0] == step else buf[: w.shape[0]]
        torch.bitwise_right_shift(w, 32, out=y)  # hi, sign-extended
        torch.add(w, y, alpha=_K, out=y)  # lo + R*hi
        y.mul_(tp)
        torch.sum(y, 1, out=o_parts[c])

    _run_chunks(body, len(w_parts),
                lambda: torch.empty((min(step, n), m), dtype=torch.int64, device=dev))
    return out


def _poly_flat(words: torch.Tensor, woff: torch.Tensor) -> torch.Tensor:
    """A for every row of a flat int64 word buffer; row r is words[woff[r]:woff[r+1]].

    Each row-aligned chunk of words is weighted by R^(2j), j counted from the chunk's first
    word; a cumsum over the chunk gives every row's sum as the difference of two prefix sums;
    multiplying by R^(-2 (row start - chunk start)) rebases the row to j = 0. On the CPU the
    chunks are cache-sized and reuse one scratch buffer per thread (fresh multi-MB buffers cost more in
    page faults than the arithmetic); elsewhere the whole buffer is one chunk, with no host sync.
    """
    n = woff.numel() - 1
    dev = words.device
    if n <= 0:
        return torch.zeros(max(n, 0), dtype=torch.int64, device=dev)
    woff = woff.to(device=dev, dtype=torch.int64)
    if not _one_chunk(dev):
        offs = woff.tolist()
        if offs[-1] - offs[0] <= CPU_CHUNK_WORDS:
            chunks = [(0, n)]
            base = torch.full((n,), offs[0], dtype=torch.int64)
        else:
            chunks, bases = [], []
            r0 = 0
            for r in range(1, n + 1):  # greedy row-aligned chunks of at most CPU_CHUNK_WORDS
                # (a row longer than that is a chunk of its own)
                if r == n or (offs[r + 1] - offs[r0] > CPU_CHUNK_WORDS and r > r0):
                    chunks.append((r0, r))
                    bases.extend([offs[r0]] * (r - r0))
                    r0 = r
            base = torch.tensor(bases, dtype=torch.int64)
        longest = max(offs[r1] - offs[r0] for r0, r1 in chunks)
    else:
        offs = None
        chunks = [(0, n)]
        base = torch.zeros(n, dtype=torch.int64, device=dev)
        longest = words.numel()
    start_loc = woff[:-1] - base
    end_loc = woff[1:] - base
    tpow, tinv = _TABLES.get(max(longest, 1), dev)
    ends = torch.empty(n, dtype=torch.int64, device=dev)  # prefix sum at each row's end

    def make_scratch() -> torch.Tensor:
        scratch = torch.empty(longest + 1, dtype=torch.int64, device=dev)
        scratch[0] = 0  # stays 0 through every in-place cumsum
        return scratch

    if offs is None:  # one chunk: its scratch is needed after, for the start prefixes
        scratch = make_scratch()
        if longest:
            yy = scratch[1:]
            torch.bitwise_right_shift(words, 32, out=yy)  # hi, sign-extended
            torch.add(words, yy, alpha=_K, out=yy)  # lo + R*hi
            yy.mul_(tpow[:longest])
            scratch.cumsum_(0)
        torch.index_select(scratch, 0, end_loc, out=ends)
    else:
        # Per-chunk views made up front (split: one call each), so the loop runs little Python.
        sizes = [offs[r1] - offs[r0] for r0, r1 in chunks]
        w_parts = words[offs[0]:offs[-1]].split(sizes)
        counts = [r1 - r0 for r0, r1 in chunks]
        e_parts = end_loc.split(counts)
        o_parts = ends.split(counts)

        def body(c: int, scratch: torch.Tensor) -> None:
            k = sizes[c]
            if k:
                w = w_parts[c]
                yy = scratch[1:k + 1]
                torch.bitwise_right_shift(w, 32, out=yy)  # hi, sign-extended
                torch.add(w, yy, alpha=_K, out=yy)  # lo + R*hi
                yy.mul_(tpow[:k])
                scratch[:k + 1].cumsum_(0)
            # end_loc <= k: only this chunk's prefixes are read
            torch.index_select(scratch, 0, e_parts[c], out=o_parts[c])

        _run_chunks(body, len(chunks), make_scratch)
    if offs is not None:
        # Rows are contiguous and every chunk starts at its first row: a row's start prefix
        # is the previous row's end prefix, or 0 for a chunk's first row.
        first = torch.zeros(n, dtype=torch.bool)
        first[[r0 for r0, _ in chunks]] = True
        starts = torch.where(first, 0, torch.roll(ends, 1))
    else:  # one chunk based at the buffer's start, which need not be row 0's start
        starts = torch.index_select(scratch, 0, start_loc)
    return (ends - starts) * tinv[start_loc]


def _words_of_rows(rows: Sequence[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Fallback for layouts with no packed buffer: pad each row's bytes to words, concatenate."""
    parts, offs = [], [0]
    for row in rows:
        b = row.detach().contiguous().reshape(1, -1)
        if b.dtype != torch.uint8:
            b = b.view(torch.uint8)
        w = _bytes_to_words_2d(b).reshape(-1)
        parts.append(w)
        offs.append(offs[-1] + w.numel())
    words = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64, device=device)
    return words, torch.tensor(offs, dtype=torch.int64, device=device)


def _jagged_words(nt: torch.Tensor):
    """(words, word offsets, per-row leading lengths, inner shape) of a jagged nested tensor."""
    values, offsets, lengths = nt._values, nt._offsets, nt._lengths
    inner = tuple(values.shape[1:])
    if nt._ragged_idx != 1 or lengths is not None:
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
    esize = values.element_size()
    unit = 1
    for d in inner:
        unit *= int(d)
    unit_bytes = unit * esize
    values = values.detach()
    if not values.is_contiguous():
        values = values.contiguous()
    if unit_bytes % 8 == 0:
        # Every row is a whole number of words: the values buffer is the word buffer.
        flat = values.reshape(-1)
        if flat.dtype != torch.uint8:
            flat = flat.view(torch.uint8)
        if flat.storage_offset() % 8:
            flat = flat.clone()
        words = flat.view(torch.int64)
        woff = offsets * (unit_bytes // 8)
        return words, woff, lead, inner
    # Rows end mid-word: re-lay each row out on its own zero-padded run of words, in one
    # vectorised scatter of elements (esize is 1, 2 or 4 here: wider elements are aligned).
    int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[esize]
    per_word = 8 // esize
    src = values.reshape(-1)
    if src.dtype != int_dtype:
        src = src.view(int_dtype)
    n_elem = lead * unit
    m = (n_elem + per_word - 1) // per_word
    woff = torch.zeros(m.numel() + 1, dtype=torch.int64, device=values.device)
    torch.cumsum(m, 0, out=woff[1:])
    start_src = offsets[:-1] * unit
    shift = woff[:-1] * per_word - start_src
    first, last = offsets[0] * unit, offsets[-1] * unit
    elem = src[first:last] if src.numel() else src
    dst_idx = torch.arange(first, last, dtype=torch.int64, device=values.device)
    dst_idx += torch.repeat_interleave(shift, n_elem, output_size=elem.numel())
    dst = torch.zeros(int(woff[-1]) * per_word, dtype=int_dtype, device=values.device)
    dst[dst_idx] = elem
    return dst.view(torch.int64), woff, lead, inner


def id_salts(sample_ids: Sequence[str], partition_id: str, device="cpu") -> torch.Tensor:
    """I = h64(partition id, sample id) per row, as an int64 tensor on `device`."""
    prefix = hashlib.blake2b(("dpobs-id-v1\x00%s\x00" % partition_id).encode("utf-8", "surrogatepass"),
                             digest_size=8)
    vals = []
    for sid in sample_ids:
        h = prefix.copy()
        h.update(str(sid).encode("utf-8", "surrogatepass"))
        vals.append(int.from_bytes(h.digest(), "little", signed=True))
    return torch.tensor(vals, dtype=torch.int64, device=device)


def _finish(acc: torch.Tensor, field: str, dtype, row_shape, lead, ids: torch.Tensor):
    """digest = A + (I xor (F + L*G)), all mod 2^64.

    For a fixed sample, A -> digest is a bijection and (F, L) -> salt is injective in L, so a
    change to the words or to the leading length always moves the digest; for fixed words,
    a different sample or partition id always moves it (xor with I is a bijection)."""
    f = _field_salt(field, dtype, row_shape)
    ids = ids.to(acc.device)
    if isinstance(lead, torch.Tensor):
        salt = torch.bitwise_xor(lead.to(acc.device) * _G + _s64(f), ids)
    else:
        salt = torch.bitwise_xor(ids, _s64(int(lead) * _G + f))
    return acc.add_(salt)


def field_digests(value: torch.Tensor, field: str, ids: torch.Tensor) -> torch.Tensor:
    """The (N,) int64 digests of every row of one tensor field (dense or nested).

    `ids` is `id_salts(...)` for the same rows. Raises UnsupportedField for layouts the
    fingerprint cannot read; the guard counts those as skipped.
    """
    if not isinstance(value, torch.Tensor):
        raise UnsupportedField("non_tensor")
    if value.is_quantized or value.device.type == "meta":
        raise UnsupportedField("unsupported_layout")
    if value.is_nested:
        if value.layout == torch.jagged:
            words, woff, lead, inner = _jagged_words(value)
        elif value.layout == torch.strided:
            rows = value.unbind()
            lead = torch.tensor([r.shape[0] if r.dim() else 0 for r in rows],
                                dtype=torch.int64, device=value.device)
            words, woff = _words_of_rows(rows, value.device)
            inner = tuple(rows[0].shape[1:]) if rows else ()
            if rows and any(tuple(r.shape[1:]) != inner or r.dim() == 0 for r in rows):
                raise UnsupportedField("unsupported_layout")
        else:
            raise UnsupportedField("unsupported_layout")
        acc = _poly_flat(words, woff)
        row_shape = (0,) + inner  # leading length enters per row through `lead`
        return _finish(acc, field, value.dtype, row_shape, lead, ids)
    if value.layout != torch.strided:
        raise UnsupportedField("unsupported_layout")
    if value.dim() == 0:
        raise UnsupportedField("no_batch_dim")
    n = value.shape[0]
    row_shape = tuple(value.shape[1:])
    if n == 0:
        return torch.zeros(0, dtype=torch.int64, device=value.device)
    acc = _poly_dense(_bytes_to_words_2d(_as_bytes_2d(value)))
    lead = row_shape[0] if row_shape else 0
    return _finish(acc, field, value.dtype, row_shape, lead, ids)


# ----------------------------------------------------------------------------- the reference


def reference_digest(row: torch.Tensor, field: str, sample_id: str, partition_id: str) -> int:
    """The specification, in plain Python over the row's bytes (slow; for tests and audits).

    Returns the digest as a signed int64, as `field_digests` stores it.
    """
    row = row.detach().cpu().contiguous()
    data = row.reshape(-1).view(torch.uint8).numpy().tobytes() if row.numel() else b""
    data += b"\x00" * (-len(data) % 8)
    acc, rpow = 0, 1
    for (w,) in struct.iter_unpack("<q", data):
        hi = w >> 32  # signed high half
        lo = w & 0xFFFFFFFF
        acc = (acc + (lo + _R * hi) * rpow) & _M64
        rpow = (rpow * _R2) & _M64
    shape = tuple(row.shape)
    f = _field_salt(field, row.dtype, shape)
    lead = shape[0] if shape else 0
    i = _h64("dpobs-id-v1", str(partition_id), str(sample_id))
    return _s64(acc + (i ^ ((lead * _G + f) & _M64)))
