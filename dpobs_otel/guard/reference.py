"""The row fingerprint, version 2: its specification in plain Python, and its constants.

The fingerprint of one row of one field is a 32-bit integer, stored as a non-negative int64:

    words   the row's exact bytes (every dtype bit-cast: bool, float8, bf16, complex, ...),
            zero-padded to a multiple of 4 and read as little-endian 32-bit words w_0..w_{m-1}
    mix     u_i = w_i xor (w_i >> 20)            logical shift: a bijection of 32-bit words
    A       = sum_i u_i * R^i            (mod 2^32)   R odd, R = 3 (mod 8)
    salt    S = I xor (F + L*G)          (mod 2^32)
                F = h32("dpobs-fp-v2", field path, dtype, row rank, row shape past dim 0)
                L = the row's leading length (0 for a scalar row), G = 0x9E3779B9 (odd)
                I = crc32("dpobs-id-v2", partition id, sample id)
    digest  A + S                        (mod 2^32)

h32 is a 4-byte blake2b and crc32 zlib's CRC-32 of the same "\x00"-joined UTF-8 bytes (both
stable across processes, unlike hash()). I is a CRC because it is computed for every row of
every call (a fifth of the guard's time on a 256-row put was one blake2b per row) and because
a CRC is the stronger guarantee there: two sample ids of one length that differ within 32
consecutive bits always get different salts, so a row handed back under another such id
always mismatches. Why the mix: a plain
weighted sum is linear, and a change confined to high bits has a difference divisible by a
high power of two, so such changes cancel easily (two flipped sign bits change it by
2^31 (R^j + R^k) = 0 mod 2^32; a negated even-length fp32 row passes). The xor-shift by 20
copies bits 20..31 onto bits 0..11, so a sign flip (fp32 bit 31; bf16 bits 15 and 31), an
exponent change (fp32 bits 23..30) or a negation reaches bit 11 or lower, and sums of such
changes stay visible (the arithmetic, and what stays probabilistic, is in docs/guard.md).

`reference_digest` is the definition; fingerprint.py computes the same numbers vectorised and
the tests hold it to this function on every dtype and layout.
"""
from __future__ import annotations

import functools
import hashlib
import struct
import zlib
from typing import Sequence

import torch

VERSION = 2

M32 = (1 << 32) - 1
R = 0x6A09E66B  # odd, R = 3 (mod 8): v2(R - 1) = 1, v2(R + 1) = 2, order 2^30 mod 2^32
assert R % 8 == 3
R_INV = pow(R, -1, 1 << 32)
G = 0x9E3779B9
MIX_SHIFT = 20


def s32(x: int) -> int:
    """A Python int mod 2^32 as the signed int32 with the same bits."""
    x &= M32
    return x - (1 << 32) if x >> 31 else x


def h32(*parts: str) -> int:
    data = "\x00".join(parts).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "little")


@functools.lru_cache(maxsize=4096)  # a put's fields repeat call after call
def field_salt(field: str, dtype: torch.dtype, row_shape: tuple[int, ...]) -> int:
    """F: what the row is (field, dtype, rank, shape past the leading dim)."""
    inner = ",".join(str(int(d)) for d in row_shape[1:])
    return h32(f"dpobs-fp-v{VERSION}", field, str(dtype), str(len(row_shape)), inner)


def id_salt(partition_id: str, sample_id: str) -> int:
    """I: whose row it is."""
    data = "\x00".join((f"dpobs-id-v{VERSION}", str(partition_id), str(sample_id)))
    return zlib.crc32(data.encode("utf-8", "surrogatepass"))


def id_salt_prefix(partition_id: str) -> bytes:
    """The bytes id_salt hashes before the sample id (the vectorised code hashes them once
    per call)."""
    return f"dpobs-id-v{VERSION}\x00{partition_id}\x00".encode("utf-8", "surrogatepass")


def salt(field_s: int, lead: int, id_s: int) -> int:
    """S = I xor (F + L*G) mod 2^32: injective in L for fixed F, a bijection in I."""
    return id_s ^ ((field_s + lead * G) & M32)


def mix(w: int) -> int:
    return w ^ (w >> MIX_SHIFT)


def row_words(row: torch.Tensor) -> list[int]:
    """The row's bytes as zero-padded little-endian unsigned 32-bit words."""
    row = row.detach().cpu().contiguous()
    data = row.reshape(-1).view(torch.uint8).numpy().tobytes() if row.numel() else b""
    data += b"\x00" * (-len(data) % 4)
    return [w for (w,) in struct.iter_unpack("<I", data)]


def weighted_sum(words: Sequence[int]) -> int:
    """A = sum_i mix(w_i) * R^i mod 2^32."""
    acc, rpow = 0, 1
    for w in words:
        acc = (acc + mix(w) * rpow) & M32
        rpow = (rpow * R) & M32
    return acc


def reference_digest(row: torch.Tensor, field: str, sample_id: str, partition_id: str) -> int:
    """The specification (slow; for tests and audits): the digest of one row, in [0, 2^32),
    as `field_digests` stores it."""
    shape = tuple(row.shape)
    lead = shape[0] if shape else 0
    s = salt(field_salt(field, row.dtype, shape), lead, id_salt(partition_id, sample_id))
    return (weighted_sum(row_words(row)) + s) & M32
