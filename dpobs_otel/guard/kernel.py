"""The fingerprint's sums and digests in one pass over memory: _rowsums.c for CPU tensors,
a Triton kernel for CUDA ones (its section below).

setup.py builds _rowsums.c as an optional extension: a plain shared library with no Python
API, loaded here with ctypes, which releases the GIL for the call, so the guard's threads
each sum a range of rows at once. Where it was not built (no compiler at install time) or
cannot be loaded, LIB is None and sums.py's torch kernels run instead; they also serve
accelerators where Triton does not. All compute reference.py's numbers (tests/guard/test_kernel.py holds them to
it and to each other).
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import warnings

import torch

from . import pool
from .reference import MIX_SHIFT, G, R

__all__ = ["LIB", "usable", "sums_dense", "sums_flat", "finish", "run_sum",
           "triton_usable", "triton_block_sums", "TILE", "host_syncs"]

# Words per call when a field is spread over threads: large enough that the call's fixed
# cost (a few microseconds through ctypes) is noise, small enough that two threads share a
# 25 MB field evenly.
PIECE_WORDS = 1 << 20
_I64, _PTR, _U32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_uint32


def _load():
    try:
        spec = importlib.util.find_spec(f"{__package__}._rowsums")
        if spec is None or not spec.origin:
            return None
        lib = ctypes.CDLL(spec.origin)
        lib.dpobs_sums_flat.argtypes = [_PTR, _I64, _PTR, _I64, _I64, _U32, _U32, _PTR]
        lib.dpobs_sums_dense.argtypes = [_PTR, _I64, _I64, _I64, _I64, _U32, _U32, _PTR]
        lib.dpobs_finish.argtypes = [_PTR, _PTR, _PTR, _I64, _U32, _U32, _I64, _PTR]
        lib.dpobs_sums_flat.restype = ctypes.c_int
        lib.dpobs_sums_dense.restype = lib.dpobs_finish.restype = None
        return lib
    except (ImportError, OSError, AttributeError, ValueError):
        return None


LIB = _load()


def usable(words: torch.Tensor) -> bool:
    """Can the one-pass kernel read this word buffer (a CPU int32 tensor, rows contiguous)?"""
    return (LIB is not None and words.device.type == "cpu" and words.dtype == torch.int32
            and (words.dim() == 1 and words.is_contiguous()
                 or words.dim() == 2 and words.stride(1) == 1))


def _spread(call, ranges: list[tuple[int, int]]) -> None:
    """call(r0, r1) for every row range, over the caller's threads (pool.spread)."""
    if len(ranges) == 1:
        call(*ranges[0])
    else:
        pool.spread(lambda rr: call(*rr), ranges)


def sums_dense(words: torch.Tensor) -> torch.Tensor:
    """A for every row of an (N, m) int32 word matrix whose rows are contiguous."""
    n, m = words.shape
    out = torch.empty(n, dtype=torch.int32)
    if n == 0:
        return out
    if m == 0:
        return out.zero_()
    base, stride, dst = words.data_ptr(), words.stride(0), out.data_ptr()

    def call(r0: int, r1: int) -> None:
        LIB.dpobs_sums_dense(base, stride, m, r0, r1, R, MIX_SHIFT, dst + 4 * r0)

    per = max(1, PIECE_WORDS // m)
    _spread(call, [(r, min(n, r + per)) for r in range(0, n, per)])
    return out


def run_sum(address: int, n_words: int) -> int:
    """A of the n_words 32-bit words at a memory address (one row, read in place, no tensor
    made): the weight fingerprint's per-piece call, a few microseconds less than sums_dense
    on a tensor, which a model's hundreds of small tensors each pay."""
    out = ctypes.c_uint32()
    LIB.dpobs_sums_dense(address, n_words, n_words, 0, 1, R, MIX_SHIFT, ctypes.addressof(out))
    return out.value


def sums_flat(words: torch.Tensor, woff: torch.Tensor) -> torch.Tensor:
    """A for every row of a flat int32 word buffer; row r is words[woff[r]:woff[r+1]].
    Offsets outside the buffer, or going back, raise ValueError (the kernel checks them
    before it reads a word)."""
    n = woff.numel() - 1
    out = torch.empty(max(n, 0), dtype=torch.int32)
    if n <= 0:
        return out
    woff = woff.to(device="cpu", dtype=torch.int64).contiguous()
    base, size, offs, dst = words.data_ptr(), words.numel(), woff.data_ptr(), out.data_ptr()

    def call(r0: int, r1: int) -> None:
        if LIB.dpobs_sums_flat(base, size, offs, r0, r1, R, MIX_SHIFT, dst + 4 * r0):
            raise ValueError("row offsets outside the word buffer or out of order")

    one = size <= PIECE_WORDS or n == 1
    _spread(call, [(0, n)] if one else _flat_ranges(woff, n))
    return out


def _flat_ranges(woff: torch.Tensor, n: int) -> list[tuple[int, int]]:
    """Row ranges of about PIECE_WORDS words each (a row longer than that is one range;
    rows spanning no more than that, one range)."""
    first, total = int(woff[0]), int(woff[-1]) - int(woff[0])
    targets = torch.arange(1, -(-total // PIECE_WORDS), dtype=torch.int64) * PIECE_WORDS + first
    cuts = sorted({0, n, *(min(n, c) for c in torch.searchsorted(woff, targets).tolist())})
    return list(zip(cuts[:-1], cuts[1:]))


def finish(acc: torch.Tensor, ids: torch.Tensor, lead, f: int) -> torch.Tensor | None:
    """fingerprint._finish in one loop: the (N,) int64 digests from a field's sums (`acc`,
    int32), its rows' id salts (int64) and leading lengths (an int64 tensor, or one int for
    every row) and its salt F; None where the loop cannot read them (the torch ops then)."""
    per_row = isinstance(lead, torch.Tensor)
    if not (usable(acc) and acc.dim() == 1 and _cpu_int64(ids, acc.numel())
            and (not per_row or _cpu_int64(lead, acc.numel()))):
        return None
    out = torch.empty(acc.numel(), dtype=torch.int64)
    LIB.dpobs_finish(acc.data_ptr(), ids.data_ptr(), lead.data_ptr() if per_row else None,
                     0 if per_row else int(lead), f, G, acc.numel(), out.data_ptr())
    return out


def _cpu_int64(t: torch.Tensor, n: int) -> bool:
    return (t.device.type == "cpu" and t.dtype == torch.int64 and t.dim() == 1
            and t.numel() == n and t.is_contiguous())


# ----------------------------------------------------------------------------- CUDA
# The fingerprint's block sums in one pass over memory on CUDA, a Triton kernel: for every
# BLOCK-word block b of a flat int32 word buffer, sum_i mix(w[BLOCK b + i]) * R^(BLOCK b + i)
# mod 2^32, already at its position (sums.py's _block_prefix then takes one cumsum of them).
#
# The torch kernels make about nine passes over a field's words (shift, mask, xor, weigh, sum,
# each a kernel of its own), this one reads each word once. The weights R^j come from three
# short tables, j = BLOCK*TILE*p + BLOCK*r + i: R^i (i < BLOCK) and R^(BLOCK r) (r < TILE),
# the same for every program, and one entry per program. int32 multiplies and sums wrap mod
# 2^32 in Triton as in torch, so the digests are the same bits (tests/cuda/ holds them to the
# CPU's; tests/guard/test_kernel_triton.py to the torch kernels, in Triton's interpreter).
#
# Used where Triton imports and the tensor is on CUDA (or, with TRITON_INTERPRET=1, on the
# CPU: the interpreter, for tests); DPOBS_GUARD_TRITON=0 turns it off. A kernel that fails to
# build or launch turns it off for the process, and the torch kernels take over.

TILE = 32  # blocks per program of the Triton kernel: 32 x 64 words, 8 KB read by each
triton_broken: list[BaseException] = []  # its first failure, kept for inspection


@functools.lru_cache(maxsize=1)
def _triton_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def block_sums(w_ptr, out_ptr, t_in, t_row, t_prog, k, nb, SHIFT: tl.constexpr,
                   MASK: tl.constexpr, BLOCK: tl.constexpr, TILE_: tl.constexpr):
        p = tl.program_id(0)
        r = tl.arange(0, TILE_)
        i = tl.arange(0, BLOCK)
        b = p * TILE_ + r
        pos = b.to(tl.int64)[:, None] * BLOCK + i[None, :]
        w = tl.load(w_ptr + pos, mask=pos < k, other=0)
        mixed = w ^ ((w >> SHIFT) & MASK)  # an arithmetic shift, masked: a logical one
        at = tl.load(t_in + i)[None, :] * tl.load(t_row + r)[:, None] * tl.load(t_prog + p)
        tl.store(out_ptr + b, tl.sum(mixed * at, axis=1), mask=b < nb)

    return triton.cdiv, block_sums


def triton_usable(words: torch.Tensor) -> bool:
    """Can the Triton kernel read this word buffer (a flat int32 CUDA tensor)?"""
    if triton_broken or os.environ.get("DPOBS_GUARD_TRITON") == "0":
        return False
    here = words.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"
    if not (here and words.dtype == torch.int32 and words.dim() == 1
            and words.is_contiguous()):
        return False
    try:
        _triton_kernel()
    except Exception as exc:  # no Triton, or one that cannot build: the torch kernels
        triton_broken.append(exc)
        return False
    return True


def triton_block_sums(words: torch.Tensor, out: torch.Tensor, powers, block: int,
                      shift: int) -> bool:
    """out[b] = the block sum of block b at its position (out: nb int32, contiguous);
    False, with out unwritten, when the kernel could not run (the caller's torch path then).
    `powers` is sums.POWERS (its tables, kept per device)."""
    k, nb, dev = words.numel(), out.numel(), words.device
    cdiv, block_sums = _triton_kernel()
    n_prog = cdiv(nb, TILE)
    t_in = powers.first(block, dev)
    t_row = powers.table(pow(R, block, 1 << 32), TILE, dev)
    t_prog = powers.at(torch.arange(n_prog, device=dev) * (block * TILE))
    try:
        block_sums[(n_prog,)](words, out, t_in, t_row, t_prog, k, nb, SHIFT=shift,
                              MASK=(1 << (32 - shift)) - 1, BLOCK=block, TILE_=TILE)
    except Exception as exc:
        triton_broken.append(exc)
        return False
    return True


def host_syncs(fn, *args):
    """(fn(*args), how many times it made the host wait for the CUDA device), counted by
    torch's sync debug mode (one warning a sync): what tests/cuda and benchmarks/gpu_check.py
    hold the guard, the weights' fingerprints and sizing to. Needs a CUDA device."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn(*args)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return result, sum("synchroniz" in str(w.message) for w in seen)
