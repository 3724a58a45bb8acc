"""One tensor's fingerprint, for weights: the guard's row fingerprint (guard/reference.py) of
the whole tensor read as one row, its name as both field and id, so the dtype, the shape and
the name are bound in with every byte in its position.

What that catches that an xor or a plain sum of the values does not: two swapped rows (each
word is weighted by R^position), a bf16 tensor sent where fp32 was (the dtype is in the salt,
and the bytes differ), a reshaped tensor (the shape is in the salt), a sign flip (the mix
carries high bits down). A 32-bit digest: a random change escapes with probability 2^-32.

A tensor is one long row, which the kernels would sum on one thread; it is cut into pieces
summed in parallel (on the caller's intra-op threads, like the guard) and the pieces are
recombined, A = sum_k A_k * R^(k*PIECE) mod 2^32, which is the one-row sum exactly.
"""
from __future__ import annotations

import torch

from ..guard.fingerprint import UnsupportedField, _as_bytes_2d, _bytes_to_words_2d
from ..guard.reference import M32, R, field_salt, id_salt, salt
from ..guard.sums import sums_flat

PARTITION = "dpobs-weights"  # the id salt's partition: weights never share a guard row's
PIECE_WORDS = 1 << 20  # 4 MB: a piece per thread-pool task, few enough to combine in Python


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's exact bytes as one flat run of int32 words, zero-padded (a copy only when
    the tensor is not contiguous or its bytes do not end on a word)."""
    if t.is_sparse or t.is_quantized or t.is_nested or t.device.type == "meta":
        raise UnsupportedField("unsupported_layout")
    return _bytes_to_words_2d(_as_bytes_2d(t.reshape(1, -1))).reshape(-1)


def _combine(piece_sums: list[int]) -> int:
    step = pow(R, PIECE_WORDS, 1 << 32)
    acc, weight = 0, 1
    for a in piece_sums:
        acc = (acc + (a & M32) * weight) & M32
        weight = (weight * step) & M32
    return acc


def fingerprint(name: str, tensor: torch.Tensor) -> int:
    """The digest in [0, 2^32) that reference_digest(tensor, name, name, PARTITION) defines."""
    t = tensor.detach()
    words = _words(t)
    m = words.numel()
    if m:
        cuts = torch.arange(0, m + PIECE_WORDS, PIECE_WORDS, dtype=torch.int64).clamp_(max=m)
        cuts = torch.unique_consecutive(cuts).to(words.device)
        body = _combine(sums_flat(words, cuts).tolist())
    else:
        body = 0
    shape = tuple(t.shape)
    lead = shape[0] if shape else 0
    return (body + salt(field_salt(name, t.dtype, shape), lead, id_salt(PARTITION, name))) & M32
