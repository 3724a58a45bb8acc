"""One tensor's fingerprint, for weights: the guard's row fingerprint (guard/reference.py) of
the whole tensor read as one row, its name as both field and id, so the dtype, the shape and
the name are bound in with every byte in its position.

What that catches that an xor or a plain sum of the values does not: two swapped rows (each
word is weighted by R^position), a bf16 tensor sent where fp32 was (the dtype is in the salt,
and the bytes differ), a reshaped tensor (the shape is in the salt), a sign flip (the mix
carries high bits down). A 32-bit digest: a random change escapes with probability 2^-32.

A tensor is one long row, which the kernels would sum on one thread; it is cut into one
piece per intra-op thread of the caller (like the guard), no piece shorter than MIN_PIECE
words, the pieces summed at once and recombined: A = sum_k A_k * R^(start_k) mod 2^32,
which is the one-row sum exactly. Per thread rather than fixed-size pieces because a
model's tensors are mostly a few MB: fixed 4 MB pieces left most of them on one thread.
"""
from __future__ import annotations

import torch

from ..guard import pool
from ..guard.fingerprint import UnsupportedField, _as_bytes_2d, _bytes_to_words_2d
from ..guard.reference import M32, R, field_salt, id_salt, salt
from ..guard.sums import sums_flat

PARTITION = "dpobs-weights"  # the id salt's partition: weights never share a guard row's
MIN_PIECE = 1 << 19  # words (2 MB): a piece must outweigh handing it to a thread (tens of us here)


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's exact bytes as one flat run of int32 words, zero-padded (a copy only when
    the tensor is not contiguous or its bytes do not end on a word)."""
    if t.is_sparse or t.is_quantized or t.is_nested or t.device.type == "meta":
        raise UnsupportedField("unsupported_layout")
    return _bytes_to_words_2d(_as_bytes_2d(t.reshape(1, -1))).reshape(-1)


def _cuts(m: int, device) -> list[int]:
    pieces = max(1, min(pool.width() if device.type == "cpu" else 1, m // MIN_PIECE))
    return [m * k // pieces for k in range(pieces + 1)]


def _body(words: torch.Tensor) -> int:
    """A of the whole run: its pieces summed on the caller's threads, then recombined."""
    cuts = _cuts(words.numel(), words.device)
    spans = list(zip(cuts[:-1], cuts[1:]))

    def piece(span):
        a, b = span
        return int(sums_flat(words[a:b], torch.tensor([0, b - a], dtype=torch.int64))[0])
    sums = pool.spread(piece, spans) if len(spans) > 1 else [piece(spans[0])]
    return sum((s & M32) * pow(R, a, 1 << 32) for s, (a, _) in zip(sums, spans)) & M32


def fingerprint(name: str, tensor: torch.Tensor) -> int:
    """The digest in [0, 2^32) that reference_digest(tensor, name, name, PARTITION) defines."""
    t = tensor.detach()
    words = _words(t)
    body = _body(words) if words.numel() else 0
    shape = tuple(t.shape)
    lead = shape[0] if shape else 0
    return (body + salt(field_salt(name, t.dtype, shape), lead, id_salt(PARTITION, name))) & M32
