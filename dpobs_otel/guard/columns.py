"""The guard's reserved digest columns: their names, how to tell them apart, how to drop them,
and the walk over a TensorDict's leaves that both hooks use."""
from __future__ import annotations

import re
from typing import Any, Iterable

import torch

from .reference import VERSION

# The column name carries the fingerprint's version, so a reader never compares digests of
# another version: version 1 wrote "__dpobs_digest__:<field>", version N >= 2 writes
# "__dpobs_digest_vN__:<field>". Every version's columns are reserved and stripped.
DIGEST_PREFIX = f"__dpobs_digest_v{VERSION}__:"
_ANY_VERSION = re.compile(r"__dpobs_digest(?:_v(\d+))?__:")

# Row age's write-time column (rowage.py) lives in this family, so that everything that
# keeps digests out of the caller's data keeps it out too; "%" never starts an escaped field
# key, so no digest column has this name. The guard neither fingerprints nor counts it.
STAMP = DIGEST_PREFIX + "%stamp"

# Rows whose digest column holds one of these were not fingerprinted by the writer: the reader
# counts them unverified. Both lie outside [0, 2^32), where every real digest lies.
NONTENSOR_SENTINEL = 0x6E6F6E2D74656E73  # "non-tens": the field was not a tensor at put
UNRECORDED_SENTINEL = 0x756E7265636F7264  # "unrecord": the guard could not fingerprint it


def _escape(part: str) -> str:
    return str(part).replace("%", "%25").replace(".", "%2E")


def digest_name(path) -> str:
    """The reserved top-level column carrying a field's digests (path: str or tuple of str)."""
    if isinstance(path, str):
        path = (path,)
    return DIGEST_PREFIX + ".".join(_escape(p) for p in path)


def is_digest_field(name) -> bool:
    """Is `name` (a str, or a 1-tuple key) a reserved digest column, of any version?"""
    if isinstance(name, tuple):
        return len(name) == 1 and is_digest_field(name[0])
    return isinstance(name, str) and _ANY_VERSION.match(name) is not None


def other_version_fields(names) -> set[str]:
    """The escaped field paths that digest columns of another version than ours name."""
    out = set()
    for name in names:
        m = _ANY_VERSION.match(name) if isinstance(name, str) else None
        if m is not None and int(m.group(1) or 1) != VERSION:
            out.add(name[m.end():])
    return out


def field_key(path) -> str:
    """A field path as digest column names spell it (after the prefix)."""
    return digest_name(path)[len(DIGEST_PREFIX):]


def strip_digests(td):
    """`td` without its digest columns (the same object when it has none). May raise."""
    if td is None or not is_tensordict(td):
        return td
    drop = [k for k in td.keys() if is_digest_field(k)]
    return td.exclude(*drop) if drop else td


def label(path: tuple) -> str:
    """The `field` label of a leaf: its path joined with dots."""
    return ".".join(str(p) for p in path)


def is_non_tensor(value) -> bool:
    try:
        from tensordict import NonTensorData, NonTensorStack
    except ImportError:  # pragma: no cover
        return not isinstance(value, torch.Tensor)
    return isinstance(value, (NonTensorData, NonTensorStack))


def is_tensordict(value) -> bool:
    from tensordict import TensorDictBase

    return isinstance(value, TensorDictBase) and not is_non_tensor(value)


def leaves(td, prefix: tuple = ()) -> Iterable[tuple[tuple, Any]]:
    """(path, value) for every leaf, non-tensor ones included (items(include_nested=True,
    leaves_only=True) silently drops NonTensorData, so this walks items() itself)."""
    for key, value in td.items():
        path = prefix + (key,)
        if is_tensordict(value):
            yield from leaves(value, path)
        else:
            yield path, value
