"""Mixed reads: some rows of a select carry digest columns, some do not (written without the
guard, or by another fingerprint version), so the store refused the select with the digest
columns (KeyError) and the core re-read the caller's fields alone. Rather than count every
row unverified, find which rows do have digests, by halving: read just the digest columns of
each half, split the halves that fail, and stop at a level where every read failed (the rows
left are counted unverified: never clean) or after MAX_PROBES reads."""
from __future__ import annotations

import torch

from .columns import UNRECORDED_SENTINEL, digest_name, is_digest_field

MAX_PROBES = 32  # digest-only reads per mixed read, at most


def digest_columns(select_fields) -> list[str]:
    out: list[str] = []
    for f in select_fields:
        if not is_digest_field(f):
            name = digest_name(f)
            if name not in out:
                out.append(name)
    return out


def recover_digests(read, sample_ids, select_fields, result) -> tuple:
    """(result with the current version's digest columns set, probes made). `read(ids,
    columns)` reads just those columns of those rows; rows it could not get them for get
    UNRECORDED_SENTINEL, which the verifier counts unverified."""
    n = len(sample_ids)
    cols = digest_columns(select_fields)
    if not cols or n == 0 or tuple(result.batch_size[:1]) != (n,):
        return result, 0
    found = {c: torch.full((n,), UNRECORDED_SENTINEL, dtype=torch.int64) for c in cols}
    result = result.copy()  # shallow: the store's object is not mutated
    level = _halves(0, n)  # the whole range already failed: the core's first read
    probes = 0
    while level and probes < MAX_PROBES:
        failed, any_ok = [], False
        for lo, hi in level:
            if probes >= MAX_PROBES:
                break
            probes += 1
            try:
                got = read(list(sample_ids[lo:hi]), cols)
            except KeyError:
                failed.extend(_halves(lo, hi))
                continue
            any_ok = _take(found, got, lo, hi) or any_ok
        level = failed if any_ok else []
    for c, values in found.items():
        result.set(c, values.to(result.device) if result.device is not None else values)
    return result, probes


def _halves(lo: int, hi: int) -> list[tuple[int, int]]:
    if hi - lo < 2:
        return []
    mid = (lo + hi) // 2
    return [(lo, mid), (mid, hi)]


def _take(found, got, lo, hi) -> bool:
    """Copy the digest columns of rows lo..hi out of a probe's result; False if malformed."""
    ok = False
    for c, values in found.items():
        v = got.get(c, None) if hasattr(got, "get") else None
        if isinstance(v, torch.Tensor) and not v.is_nested and v.dtype == torch.int64 \
                and tuple(v.shape) == (hi - lo,):
            values[lo:hi] = v.cpu()
            ok = True
    return ok
