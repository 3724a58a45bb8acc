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
(reading memory, one thread does not reach the bandwidth two do). Installs without the
kernel go through the guard's torch kernels.

An accelerator's tensor is fingerprinted where it lies and its digest stays there
(`pending`: a 0-dim int64 tensor on the device, the host never waits): a sync's digests
come to the host together, in one transfer (`settle`). Its pieces are at most DEVICE_PIECE
words, so the scratch memory the torch kernels take beside a large tensor stays bounded.
"""
from __future__ import annotations

import ctypes

import torch

from ..guard import kernel, pool, sums
from ..guard.fingerprint import UnsupportedField, _as_bytes_2d, _bytes_to_words_2d, _contiguous
from ..guard.reference import M32, MIX_SHIFT, R, field_salt, id_salt, s32, salt
from ..guard.sums import sums_flat

__all__ = ["fingerprint", "pending", "settle", "PARTITION"]

PARTITION = "dpobs-weights"  # the id salt's partition: weights never share a guard row's
MIN_PIECE = 1 << 22  # words (16 MB): smaller pieces ran slower than one thread here
DEVICE_PIECE = 1 << 26  # words (256 MB) per piece on an accelerator: its scratch, at most


def _readable(t: torch.Tensor) -> torch.Tensor:
    if t.is_sparse or t.is_quantized or t.is_nested or t.device.type == "meta":
        raise UnsupportedField("unsupported_layout")
    return _contiguous(t)


def _spans(m: int, piece: int | None = None) -> list[tuple[int, int]]:
    pieces = max(1, -(-m // piece)) if piece else max(1, min(pool.width(), m // MIN_PIECE))
    cuts = [m * k // pieces for k in range(pieces + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def _recombine(sums_, spans) -> int:
    return sum((s & M32) * pow(R, a, 1 << 32) for s, (a, _) in zip(sums_, spans)) & M32


def _body_in_place(t: torch.Tensor) -> int:
    """A of a contiguous CPU tensor's bytes, read where they lie (the C kernel)."""
    address, nbytes = t.data_ptr(), t.numel() * t.element_size()
    full = nbytes // 4
    spans = _spans(full)

    def piece(span):
        a, b = span
        return kernel.run_sum(address + 4 * a, b - a)
    sums_ = [piece(spans[0])] if len(spans) == 1 else pool.spread(piece, spans)
    body = _recombine(sums_, spans) if full else 0
    if nbytes % 4:  # the last word, zero-padded
        w = int.from_bytes(ctypes.string_at(address + 4 * full, nbytes % 4), "little")
        body = (body + (w ^ (w >> MIX_SHIFT)) * pow(R, full, 1 << 32)) & M32
    return body


def _words(t: torch.Tensor) -> torch.Tensor:
    return _bytes_to_words_2d(_as_bytes_2d(t.reshape(1, -1))).reshape(-1)


def _piece_sum(words: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """A of words[a:b] as a 1-element int32 tensor on their device (offsets made there too:
    no host-to-device copy)."""
    offsets = torch.arange(2, dtype=torch.int64, device=words.device) * (b - a)
    return sums_flat(words.narrow(0, a, b - a), offsets)


def _body_of_words(t: torch.Tensor) -> int:
    """A through the guard's word layout and torch kernels, on the CPU (no C kernel)."""
    words = _words(t)
    spans = _spans(words.numel())

    def piece(span):
        return int(_piece_sum(words, *span))
    sums_ = [piece(spans[0])] if len(spans) == 1 else pool.spread(piece, spans)
    return _recombine(sums_, spans)


def _body_on_device(t: torch.Tensor) -> torch.Tensor:
    """A as a 0-dim int64 tensor on t's device, the pieces recombined there (int32
    arithmetic wraps mod 2^32, the sum's own); nothing read back."""
    words = _words(t)
    spans = _spans(words.numel(), DEVICE_PIECE)
    body = _piece_sum(words, *spans[0])
    for a, b in spans[1:]:
        body = body + _piece_sum(words, a, b) * s32(pow(R, a, 1 << 32))
    return body.to(torch.int64).reshape(())


def pending(name: str, tensor: torch.Tensor):
    """The digest of `fingerprint`, as an int for a CPU tensor, or, for an accelerator's,
    a 0-dim int64 tensor on its device that will hold it (no host sync): `settle` brings a
    sync's worth of them to the host at once."""
    t = _readable(tensor.detach())
    shape = tuple(t.shape)
    s = salt(field_salt(name, t.dtype, shape), shape[0] if shape else 0,
             id_salt(PARTITION, name))
    if not t.numel():
        return s & M32
    if not sums.one_chunk(t.device):  # the CPU (a test may send it the device path)
        body = _body_in_place(t) if kernel.LIB is not None else _body_of_words(t)
        return (body + s) & M32
    return _body_on_device(t).add_(s).bitwise_and_(M32)


def settle(digests: dict) -> dict[str, int]:
    """{name: digest} from `pending`'s values: every device's tensors brought back in one
    transfer per device (one for a sync on one GPU), ints as they are."""
    out = {k: v for k, v in digests.items() if not isinstance(v, torch.Tensor)}
    by_device: dict = {}
    for k, v in digests.items():
        if isinstance(v, torch.Tensor):
            by_device.setdefault(v.device, []).append(k)
    for keys in by_device.values():
        values = torch.stack([digests[k] for k in keys]).cpu().tolist()  # the one transfer
        out.update(zip(keys, values))
    return {k: out[k] for k in digests}


def fingerprint(name: str, tensor: torch.Tensor) -> int:
    """The digest in [0, 2^32) that reference_digest(tensor, name, name, PARTITION) defines
    (an accelerator's tensor: one host sync; `pending` and `settle` make one per sync)."""
    d = pending(name, tensor)
    return d.item() if isinstance(d, torch.Tensor) else d
