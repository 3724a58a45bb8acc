"""The wire guard (`verify_tensor_hash=True`): per-row fingerprints written beside the rows at
put and checked by any reader at get. This is the API adapters and the core use; the modules
under it are internals:

    hooks.py        WireGuard: before_put / before_get / after_get, totals()
    counts.py       the cumulative counts and their observable counters
    columns.py      the reserved digest columns: names, recognising and stripping them
    fingerprint.py  the vectorised fingerprint (dense, jagged, any dtype, CPU or CUDA)
    reference.py    the same fingerprint in plain Python: its specification
"""
from .columns import (DIGEST_PREFIX, NONTENSOR_SENTINEL, UNRECORDED_SENTINEL, digest_name,
                      is_digest_field, strip_digests)
from .hooks import WireGuard

__all__ = ["WireGuard", "DIGEST_PREFIX", "NONTENSOR_SENTINEL", "UNRECORDED_SENTINEL",
           "digest_name", "is_digest_field", "strip_digests"]
