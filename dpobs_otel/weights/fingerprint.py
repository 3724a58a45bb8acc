"""One tensor's fingerprint, for weights: the guard's row fingerprint (guard/reference.py) of
the whole tensor read as one row, its name as both field and id, so the dtype, the shape and
the name are bound in with every byte in its position.

What that catches that an xor or a plain sum of the values does not: two swapped rows (each
word is weighted by R^position), a bf16 tensor sent where fp32 was (the dtype is in the salt,
and the bytes differ), a reshaped tensor (the shape is in the salt), a sign flip (the mix
carries high bits down). A 32-bit digest: a random change escapes with probability 2^-32.

A CPU tensor is read in place by the C kernel (guard/kernel.py run_sum), no word tensor
made: a model has hundreds of small tensors and each would otherwise pay tens of
microseconds of tensor bookkeeping. A large one is cut into one piece per intra-op thread
of the caller (like the guard), no piece shorter than MIN_PIECE words, the pieces summed
at once and recombined: A = sum_k A_k * R^(start_k) mod 2^32, the one-row sum exactly
(reading memory, one thread does not reach the bandwidth two do). Other devices, and
installs without the kernel, go through the guard's torch kernels.
"""
from __future__ import annotations

import ctypes

import torch

from ..guard import kernel, pool
from ..guard.fingerprint import UnsupportedField, _as_bytes_2d, _bytes_to_words_2d
from ..guard.reference import M32, MIX_SHIFT, R, field_salt, id_salt, salt
from ..guard.sums import sums_flat

PARTITION = "dpobs-weights"  # the id salt's partition: weights never share a guard row's
MIN_PIECE = 1 << 22  # words (16 MB): smaller pieces ran slower than one thread here


def _readable(t: torch.Tensor) -> torch.Tensor:
    if t.is_sparse or t.is_quantized or t.is_nested or t.device.type == "meta":
        raise UnsupportedField("unsupported_layout")
    return t if t.is_contiguous() else t.contiguous()


def _spans(m: int) -> list[tuple[int, int]]:
    pieces = max(1, min(pool.width(), m // MIN_PIECE))
    cuts = [m * k // pieces for k in range(pieces + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def _recombine(sums, spans) -> int:
    return sum((s & M32) * pow(R, a, 1 << 32) for s, (a, _) in zip(sums, spans)) & M32


def _body_in_place(t: torch.Tensor) -> int:
    """A of a contiguous CPU tensor's bytes, read where they lie (the C kernel)."""
    address, nbytes = t.data_ptr(), t.numel() * t.element_size()
    full = nbytes // 4
    spans = _spans(full)

    def piece(span):
        a, b = span
        return kernel.run_sum(address + 4 * a, b - a)
    sums = [piece(spans[0])] if len(spans) == 1 else pool.spread(piece, spans)
    body = _recombine(sums, spans) if full else 0
    if nbytes % 4:  # the last word, zero-padded
        w = int.from_bytes(ctypes.string_at(address + 4 * full, nbytes % 4), "little")
        body = (body + (w ^ (w >> MIX_SHIFT)) * pow(R, full, 1 << 32)) & M32
    return body


def _body_of_words(t: torch.Tensor) -> int:
    """A through the guard's word layout and kernels (any device)."""
    words = _bytes_to_words_2d(_as_bytes_2d(t.reshape(1, -1))).reshape(-1)
    spans = _spans(words.numel()) if words.device.type == "cpu" else [(0, words.numel())]

    def piece(span):
        a, b = span
        return int(sums_flat(words[a:b], torch.tensor([0, b - a], dtype=torch.int64))[0])
    sums = [piece(spans[0])] if len(spans) == 1 else pool.spread(piece, spans)
    return _recombine(sums, spans)


def fingerprint(name: str, tensor: torch.Tensor) -> int:
    """The digest in [0, 2^32) that reference_digest(tensor, name, name, PARTITION) defines."""
    t = _readable(tensor.detach())
    if not t.numel():
        body = 0
    elif t.device.type == "cpu" and kernel.LIB is not None:
        body = _body_in_place(t)
    else:
        body = _body_of_words(t)
    shape = tuple(t.shape)
    lead = shape[0] if shape else 0
    return (body + salt(field_salt(name, t.dtype, shape), lead, id_salt(PARTITION, name))) & M32
