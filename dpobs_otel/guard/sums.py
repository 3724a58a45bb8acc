"""The fingerprint's kernels: A = sum_j mix(w_j) * R^j mod 2^32 for every row at once, over an
(N, m) word matrix or a flat word buffer with row offsets, in int32 ops only.

int32 multiplies, sums and cumsums wrap mod 2^32 on every backend, which is the arithmetic
reference.py specifies; no unsigned tensor is ever created, so the same code runs on CUDA.

CPU chunks. Each op works on at most CPU_CHUNK_WORDS words, just under torch's parallel grain
size (32768 elements), so it runs on the thread that called it: no OpenMP barrier to stall on
when the machine is busy (docs/development/performance.md, "The wire guard", has the figure). Up to
`_workers()` Python threads share a field's chunks instead (pool.share; torch releases the
GIL inside every op): as many as the hook's caller has intra-op threads, so a put or get
uses the cores its own torch ops would. Accelerators take a field in one chunk, with no host
sync; slices are narrow() calls (the same views), which torch's FakeTensorMode also runs with
device="cuda" on a CPU build, where tests/guard/test_host_syncs.py counts the host syncs.

CPU tensors go to the one-pass C kernel (kernel.py) where it was built; what follows is the
path for accelerators and for installs without it.
"""
from __future__ import annotations

import itertools
import threading

import torch

from . import kernel, pool
from .reference import MIX_SHIFT, R, R_INV, s32

BLOCK = 64  # words per block of the flat path's prefix sums
CPU_CHUNK_WORDS = 511 * BLOCK  # 32704: under the grain size, a whole number of blocks
# With one intra-op thread no op can go parallel: chunks this many times larger (512 KB) cut
# the per-op dispatch cost while staying in L2.
SERIAL_FACTOR = 4
# Python threads sharing a field's chunks, at most. Each chunk's ops hold the GIL only while
# they are dispatched, a small part of a chunk (the serial chunks are SERIAL_FACTOR times
# larger); past a few threads the GIL, not the cores, is the limit (docs/development/performance.md).
MAX_WORKERS = 8
MAX_TABLES = 256  # short power tables kept (per base, length and device)
# Positions per piece of the row-boundary lookups on the CPU: each piece's (positions, 64)
# ops then stay under the grain size, like the chunks. (The gather itself never goes
# parallel: torch loops over a 1-D gather's index serially. Smaller pieces pay the per-op
# overhead many times over: docs/development/performance.md.)
GATHER_ROWS = CPU_CHUNK_WORDS // BLOCK
_LOW = 1 << 15  # positions split into 15-bit halves for the two-level power tables
_LOW_MASK = _LOW - 1
# An arithmetic shift then this mask is a logical shift. Both as 0-dim int32 tensors: a Python
# scalar is wrapped into a tensor on every call, which costs more than the op on a chunk.
_SHIFT = torch.tensor(MIX_SHIFT, dtype=torch.int32)
_MIX_MASK = torch.tensor((1 << (32 - MIX_SHIFT)) - 1, dtype=torch.int32)


class _Powers:
    """Per device: R^i for i below the longest row or chunk seen (grown by doubling), and
    two-level tables that give R^p and R^-p for any position p as lo[p & 0x7fff] *
    hi[(p >> 15) & 0x7fff] (R has order 2^30 mod 2^32, so positions wrap there)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._first: dict[str, torch.Tensor] = {}
        self._two_level: dict[str, tuple] = {}
        self._tables: dict[tuple, torch.Tensor] = {}

    @staticmethod
    def _build(base: int, n: int, device) -> torch.Tensor:
        t = torch.empty(n, dtype=torch.int32, device=device)
        t.narrow(0, 0, 1).fill_(1)
        filled = 1
        while filled < n:
            k = min(filled, n - filled)
            torch.mul(t.narrow(0, 0, k), s32(pow(base, filled, 1 << 32)),
                      out=t.narrow(0, filled, k))
            filled += k
        return t

    def table(self, base: int, n: int, device) -> torch.Tensor:
        """base^0 .. base^(n-1) as int32 (short tables; kept, since building one is a dozen
        ops, a tenth of a 130K-word jagged field's time)."""
        key = (base, n, str(device))
        got = self._tables.get(key)
        if got is None:
            with self._lock:
                if len(self._tables) >= MAX_TABLES:
                    self._tables.clear()  # bounded: chunk counts vary with field sizes
                got = self._tables[key] = self._build(base, n, device)
        return got

    def first(self, n: int, device) -> torch.Tensor:
        """R^0 .. R^(n-1) as int32."""
        key = str(device)
        cur = self._first.get(key)
        if cur is None or cur.numel() < n:
            with self._lock:
                cur = self._first.get(key)
                if cur is None or cur.numel() < n:
                    size = max(1024, 1 << max(0, n - 1).bit_length())
                    cur = self._first[key] = self._build(R, size, device)
        return cur.narrow(0, 0, n)

    def at(self, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        """R^p (or R^-p) for an int64 tensor of positions p >= 0, as int32."""
        key = str(positions.device)
        tables = self._two_level.get(key)
        if tables is None:
            with self._lock:
                tables = self._two_level.get(key)
                if tables is None:
                    tables = self._two_level[key] = tuple(
                        self._build(pow(b, step, 1 << 32), _LOW, positions.device)
                        for b in (R, R_INV) for step in (1, _LOW))
        lo, hi = tables[2:] if inverse else tables[:2]
        low = torch.bitwise_and(positions, _LOW_MASK)
        high = torch.bitwise_right_shift(positions, 15).bitwise_and_(_LOW_MASK)
        return torch.gather(lo, 0, low) * torch.gather(hi, 0, high)


POWERS = _Powers()


def mix_into(w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = w xor (w >>> 16) for int32 w (out must not alias w)."""
    torch.bitwise_right_shift(w, _SHIFT, out=out)
    out.bitwise_and_(_MIX_MASK)
    return out.bitwise_xor_(w)


def _cpu_chunk() -> int:
    return CPU_CHUNK_WORDS * (SERIAL_FACTOR if torch.get_num_threads() == 1 else 1)


def one_chunk(device) -> bool:
    """Accelerators take a whole field in one chunk: no host sync, few kernel launches."""
    return torch.device(device).type != "cpu"


def _workers(n_chunks: int) -> int:
    """Threads for n_chunks CPU chunks: the hook's caller's intra-op thread count (pool.width:
    torch.set_num_threads(1) keeps it on one core), at most MAX_WORKERS, >= 4 chunks each."""
    return max(1, min(pool.width(), MAX_WORKERS, n_chunks // 4))


def _run_chunks(body, n_chunks: int, make_scratch) -> None:
    """body(i, scratch) for every chunk i, each exactly once, in any order, each thread with
    its own `make_scratch()`. The threads (pool.share) pull chunk indices from one shared
    counter, so a helper the OS has descheduled delays nobody: the others take its chunks."""
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
            scratch = None
            for i in counter:
                if i >= n_chunks or errors:
                    return
                if scratch is None:  # none for a helper that arrives too late
                    scratch = make_scratch()
                body(i, scratch)
        except BaseException as e:  # re-raised in the caller
            errors.append(e)

    pool.share(work, workers)
    if errors:
        raise errors[0]


def sums_dense(words: torch.Tensor) -> torch.Tensor:
    """A for every row of an (N, m) int32 word matrix, as int32. Rows longer than a CPU chunk
    go through the flat path (whose chunks need not align with rows)."""
    if kernel.usable(words):
        return kernel.sums_dense(words)
    n, m = words.shape
    dev = words.device
    if n == 0 or m == 0:
        return torch.zeros(n, dtype=torch.int32, device=dev)
    cpu_chunk = _cpu_chunk()
    flat = words.reshape(-1) if words.is_contiguous() else None
    if (m > cpu_chunk and not one_chunk(dev)
            or one_chunk(dev) and flat is not None and kernel.triton_usable(flat)):
        # rows a whole number of chunks apart; on CUDA the flat path's one-pass kernel
        return sums_flat(flat if flat is not None else words.reshape(-1),
                         torch.arange(n + 1, dtype=torch.int64, device=dev) * m)
    out = torch.empty(n, dtype=torch.int32, device=dev)
    weights = POWERS.first(m, dev)
    step = n if one_chunk(dev) else max(1, cpu_chunk // m)
    w_parts, o_parts = words.split(step), out.split(step)  # views made in one call each

    def body(c: int, buf: torch.Tensor) -> None:
        w = w_parts[c]
        y = mix_into(w, buf.narrow(0, 0, w.shape[0])).mul_(weights)
        torch.sum(y, 1, dtype=torch.int32, out=o_parts[c])

    _run_chunks(body, len(w_parts),
                lambda: torch.empty((min(step, n), m), dtype=torch.int32, device=dev))
    return out


def _block_prefix(words: torch.Tensor) -> torch.Tensor:
    """P[b] = sum over the words before block b of mix(w_j) R^j (int32, one entry per block
    boundary). Each block is first weighted from its own start (R^0..R^63, a table that stays
    in L1), then every block sum is moved to its position by R^(64 b), then one cumsum."""
    k = words.numel()
    dev = words.device
    nb = (k + BLOCK - 1) // BLOCK
    if k == 0:
        return torch.zeros(1, dtype=torch.int32, device=dev)
    chunk = nb * BLOCK if one_chunk(dev) else _cpu_chunk()
    n_chunks = -(-k // chunk)
    # Every block is written below (the CPU's last chunk is zero-padded to whole chunks of
    # blocks, so the rebase is two broadcasts): no zero fill, which would be one parallel op.
    prefix = torch.empty(n_chunks * (chunk // BLOCK) + 1, dtype=torch.int32, device=dev)
    prefix.narrow(0, 0, 1).zero_()
    blocks = prefix.narrow(0, 1, prefix.numel() - 1)
    if one_chunk(dev) and kernel.triton_usable(words) \
            and kernel.triton_block_sums(words, blocks, POWERS, BLOCK, MIX_SHIFT):
        blocks.cumsum_(0)  # one pass over the words made the blocks, at their positions
        return prefix
    weights = POWERS.first(BLOCK, dev)
    w_parts, b_parts = words.split(chunk), blocks.split(chunk // BLOCK)

    def body(c: int, buf: torch.Tensor) -> None:
        w = w_parts[c]
        length = w.numel()
        padded = buf.numel()  # the last chunk is zero-padded to a whole chunk of blocks
        y = buf
        mix_into(w, y.narrow(0, 0, length))
        if padded > length:
            y.narrow(0, length, padded - length).zero_()
        y = y.view(-1, BLOCK).mul_(weights)
        torch.sum(y, 1, dtype=torch.int32, out=b_parts[c])

    _run_chunks(body, len(w_parts), lambda: torch.empty(chunk, dtype=torch.int32, device=dev))
    if one_chunk(dev):
        blocks.mul_(POWERS.at(torch.arange(nb, device=dev) * BLOCK))
    else:  # block i of chunk c sits at c*chunk + 64 i: R^(64 i) (a table) * R^(c*chunk)
        per = chunk // BLOCK
        grid = blocks.view(n_chunks, per)
        inner = POWERS.table(pow(R, BLOCK, 1 << 32), per, dev)
        outer = POWERS.table(pow(R, chunk, 1 << 32), n_chunks, dev)[:, None]
        rows = max(1, _cpu_chunk() // per)  # each op under the grain size, as above
        for r0 in range(0, n_chunks, rows):
            grid[r0:r0 + rows].mul_(inner).mul_(outer[r0:r0 + rows])
    blocks.cumsum_(0)  # in place, int32: wraps mod 2^32
    return prefix


def _prefix_at(words: torch.Tensor, prefix: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """T(p) = sum_{j < p} mix(w_j) R^j at the positions p (int64): the block prefix plus the
    words from p's block start up to p, gathered (CPU: for a chunk of positions at a time)."""
    step = GATHER_ROWS if torch.get_num_threads() > 1 else 1 << 62  # one thread: one piece
    if one_chunk(p.device) or p.numel() <= step:
        return _prefix_at_once(words, prefix, p)
    return torch.cat([_prefix_at_once(words, prefix, q) for q in p.split(step)])


def _prefix_at_once(words, prefix, p):
    block = torch.div(p, BLOCK, rounding_mode="floor")
    start = block * BLOCK
    t = torch.arange(BLOCK, device=p.device)
    # Multiplying by a 0/1 mask, and clamping the indices, cost a fraction of torch.where.
    keep = (t < (p - start).unsqueeze(1)).to(torch.int32)
    if words.numel():  # gather: getitem and index_select are far slower here
        idx = (start.unsqueeze(1) + t).clamp_max_(words.numel() - 1)
        g = torch.gather(words, 0, idx.reshape(-1)).view(idx.shape)
    else:
        g = torch.zeros(keep.shape, dtype=torch.int32, device=p.device)
    y = mix_into(g, torch.empty_like(g)).mul_(POWERS.first(BLOCK, p.device)).mul_(keep)
    return (torch.gather(prefix, 0, block)
            + torch.sum(y, 1, dtype=torch.int32) * POWERS.at(start))


def sums_flat(words: torch.Tensor, woff: torch.Tensor) -> torch.Tensor:
    """A for every row of a flat int32 word buffer; row r is words[woff[r]:woff[r+1]]:
    T(end) - T(start), rebased to position 0 by R^(-start)."""
    if kernel.usable(words):
        return kernel.sums_flat(words, woff)
    n = woff.numel() - 1
    dev = words.device
    if n <= 0:
        return torch.zeros(max(n, 0), dtype=torch.int32, device=dev)
    woff = woff.to(device=dev, dtype=torch.int64)
    t = _prefix_at(words, _block_prefix(words), woff)
    return (t.narrow(0, 1, n) - t.narrow(0, 0, n)) * POWERS.at(woff.narrow(0, 0, n), inverse=True)
