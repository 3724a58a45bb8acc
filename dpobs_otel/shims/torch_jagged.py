"""The one place dpobs reads torch's private attributes of jagged nested tensors.

torch.nested's public accessors (numel, nbytes, values(), offsets()) dispatch through
__torch_function__ on the hot path; the attributes below are plain reads (docs/development/performance.md,
"The hot path's shortcuts", has the figures and their command). Each is pinned by
tests/shims/test_torch_jagged.py on the pinned torch, so an upgrade that changes their meaning
fails there, not as wrong byte counts or digests.

- values: the packed buffer of every row, leading dim = sum of the row lengths it spans. It
  may view a larger allocation: a view of some rows of a batch (built from a slice of its
  offsets; torch has no dim-0 slice of a jagged tensor, tensordict 0.15 copies the rows out
  and 0.10 raises) leaves offsets[0] > 0, torch.nested.narrow sets lengths.
- offsets: int64 (rows + 1,); row i starts at offsets[i] in values.
- lengths: None, or int64 (rows,) when rows do not tile values (a narrowed view); row i then
  spans values[offsets[i]:offsets[i] + lengths[i]].
- ragged_dim: the dim of the ragged length (1 for the (rows, ragged, ...) layout dpobs reads).
"""
from __future__ import annotations

import torch
from torch.nested._internal.nested_tensor import NestedTensor


def is_jagged(t) -> bool:
    """Is t a jagged nested tensor? Told by its type: the tensor's own is_nested, layout,
    device and dtype dispatch through __torch_function__ (each a dispatch, several per field
    of every guarded put and get: docs/development/performance.md, "The one-pass C kernel")."""
    return isinstance(t, NestedTensor)


def device(t: torch.Tensor) -> torch.device:
    """t.device, read off the values buffer for a jagged tensor (same device, no dispatch)."""
    return t._values.device if isinstance(t, NestedTensor) else t.device


def values(nt: torch.Tensor) -> torch.Tensor:
    return nt._values


def offsets(nt: torch.Tensor) -> torch.Tensor:
    return nt._offsets


def lengths(nt: torch.Tensor) -> torch.Tensor | None:
    return nt._lengths


def ragged_dim(nt: torch.Tensor) -> int:
    return nt._ragged_idx


def tiles_values(nt: torch.Tensor) -> bool:
    """True when rows are consecutive spans of values, ragged in dim 1 (no lengths): the
    layout the fast paths read straight from the buffer."""
    return nt._ragged_idx == 1 and nt._lengths is None


def row_lengths(nt: torch.Tensor) -> torch.Tensor:
    """Each row's ragged length, whichever of lengths and offsets describes it."""
    lens = nt._lengths
    return nt._offsets.diff() if lens is None else lens
