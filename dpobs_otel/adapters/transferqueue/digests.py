"""The wire guard's digests on TransferQueue: carried in the rows' tags, not as columns.

The guard hands the data plane one digest column per tensor field (`__dpobs_digest_v2__:<field>`,
int64 (N,)). TransferQueue stores and gathers every field row by row, so those columns
doubled the fields a guarded put writes and a guarded read fetches, and a guarded get cost
nearly twice a bare one (docs/development/performance.md, "TransferQueue"). TransferQueue also keeps
per-row tags (its `custom_meta`), which a read fetches with the metadata it looks up before
any data moves. So on TransferQueue the digests travel as tags.

One tag entry per row and write, not one per field: TransferQueue copies and serialises each
row's tags several times per call, and that cost grows with the entries (measured in the same
section). The entry's name is the digest
prefix and the written fields, `__dpobs_digest_v2__:tok,adv,mask,score`; its value is bytes,
one little-endian int64 per field in that order (a digest in [0, 2^32), or a sentinel).

Tags are merged per entry name (TransferQueue's client reads a row's tags and `dict.update`s
them), and the writer sees the rows' current tags, so:
  * a delta write (new fields for existing keys) adds its own entry and keeps the others;
  * a rewrite of the same fields replaces their entry;
  * a rewrite of some fields of an earlier, wider entry also rewrites those fields' digests
    inside that entry, so no entry ever holds a stale digest and no order between entries
    is needed;
  * a read of any subset of fields finds each field's digest in whichever entry has it;
  * a row written without the guard has no entry: counted unverified, per row, while the
    digested rows of the same read are checked (a mixed read does not fall back whole);
  * kv_clear drops a key with its tags.
The tags never reach the caller: `kv_list` and the KVBatchMeta of a put leave them out.

Row age (rowage.py) rides in the same entry: its stamp column is one more key of the family,
`%stamp`, so a put with both the guard and row age on writes `...:tok,adv,%stamp`, one entry
whose value is one int64 longer. A delta write's entry carries the new stamp and rewrites the
stamp of the row's older entries (the overlap rule above): the row is restamped. With the guard
off a stamped put writes an entry of its own, `__dpobs_digest_v2__:%stamp`, and goes through
the three-step put below (docs/development/performance.md, "Row age", has what that costs). A data_parser
leaves the stamp as it is: the write time stays true whatever the parser does to the values.

`put_with_digests` is the guarded put: kv_batch_put's own three steps, so that the writer
sees the rows' current tags, and so that the rows are fingerprinted (on a helper thread of
the core, protocol.OverlapsGuard) while the first step, a round trip to the controller, runs.
"""
from __future__ import annotations

import asyncio
import functools

import numpy as np
import torch

from ...guard import (DIGEST_PREFIX, NONTENSOR_SENTINEL, UNRECORDED_SENTINEL, digest_name,
                     is_digest_field)
from ...guard.columns import STAMP

STAMP_KEY = STAMP[len(DIGEST_PREFIX):]  # row age's write time: one more word in the entry

_WORD = np.dtype("<i8")  # the entry's byte layout, whatever the host's order
_RESERVED = "__dpobs_digest"  # what every reserved name starts with (a cheap first test)


def carries_tags(tel) -> bool:
    """Do this Telemetry's reads need the rows' tags: the guard's digests or row age's stamps."""
    return getattr(tel, "guard", None) is not None or getattr(tel, "row_age", None) is not None


def _entry_name(fields: tuple[str, ...]) -> str:
    # Field keys escape "%" (as %25), so "%2C" cannot occur in one: a safe escape for ",".
    return DIGEST_PREFIX + ",".join(f.replace(",", "%2C") for f in fields)


@functools.lru_cache(maxsize=1024)
def _entry_fields(name: str) -> tuple[str, ...] | None:
    """The field keys an entry name covers, or None when it is no entry of this version."""
    if not name.startswith(DIGEST_PREFIX):
        return None
    return tuple(f.replace("%2C", ",") for f in name[len(DIGEST_PREFIX):].split(","))


def _is_entry(name, value) -> bool:
    return type(value) is bytes and isinstance(name, str) and name.startswith(DIGEST_PREFIX)


def digests_to_tags(fields, tags, n: int, unrecorded: bool = False, current=None):
    """(fields without the guard's digest columns, tags carrying them), for a put of n rows.

    current: the rows' tags as the store holds them now (one dict per row), so that a rewrite
    of some fields of an earlier entry rewrites their digests there too.
    unrecorded: the values will change inside TransferQueue (a data_parser), so the rows get
    the "unrecorded" sentinel: readers count them unverified, never corrupt, and a digest
    left by an earlier put of the same key is overwritten."""
    names = [k for k in fields.keys() if is_digest_field(k)]
    if not names:
        return fields, tags
    bare = fields.exclude(*names)
    if tags is not None and len(tags) != n:
        return bare, tags  # TransferQueue refuses the lengths itself, in its own words
    matrix = torch.stack([fields.get(k).to("cpu", torch.int64) for k in names], 1)
    # A non-tensor field's column holds only its sentinel, and readers never check such a
    # field: its digest would cost every row 8 bytes and tell nothing. (A real digest is
    # never the sentinel, so the first row tells.)
    keep = (matrix[0] != NONTENSOR_SENTINEL).tolist() if n else [False] * len(names)
    if not all(keep):
        names = [k for k, kept in zip(names, keep) if kept]
        matrix = matrix[:, torch.tensor(keep)]
    if not names:
        return bare, tags
    keys = tuple(k[len(DIGEST_PREFIX):] for k in names)
    if unrecorded:  # the write time stays true whatever the parser does to the values
        kept = torch.tensor([k == STAMP_KEY for k in keys])
        matrix = torch.where(kept, matrix, torch.full_like(matrix, UNRECORDED_SENTINEL))
    # Each row's words as one bytes object: a void view hands them out in one C loop
    # (half the time of slicing one buffer row by row), trailing zero bytes kept.
    words = np.ascontiguousarray(matrix.numpy().astype(_WORD, copy=False))
    blobs = words.view(f"V{8 * len(names)}").reshape(-1).tolist()
    name = _entry_name(keys)
    rows = [{name: blob} for blob in blobs]
    if current is not None and len(current) == n:
        _rewrite_overlaps(current, rows, name, keys, matrix)
    if tags is not None:
        rows = [{**tag, **row} for tag, row in zip(tags, rows)]
    return bare, rows


def parser_kwargs(data_parser) -> dict:
    """`data_parser=` for TransferQueue's put calls only when the caller gave one:
    TransferQueue 0.1.6 has no such parameter (kv_put, kv_batch_put, the clients' put; it
    arrived in 0.1.7), so passing None there would raise where the bare call does not."""
    return {} if data_parser is None else {"data_parser": data_parser}


@functools.lru_cache(maxsize=1)  # once per process: guarded puts are a hot path
def _length_refusals() -> tuple[str, str]:
    """kv_batch_put's refusals of keys that do not match the fields or the tags, worded as
    the installed TransferQueue words them (0.1.7-0.1.9 differ from 0.1.6 and 0.1.10 on)."""
    try:
        from importlib.metadata import version

        release = tuple(int(x) for x in version("transferqueue").split(".")[:3])
    except Exception:  # not installed as a distribution, or an unusual version string
        release = None
    if release is not None and (0, 1, 7) <= release < (0, 1, 10):
        return ("Length of `keys` ({n}) does not match `fields` batch size ({m}).",
                "Length of `keys` ({n}) does not match length of `tags` ({t}).")
    return ("`keys` with length {n} does not match the `fields` TensorDict with batch_size {m}",
            "keys with length {n} does not match length of tags {t}")


def put_with_digests(client, sample_ids, partition_id, fields, tags, data_parser,
                     pending=None):
    """kv_batch_put's own steps (look the rows up, merge the tags, put) through a
    TransferQueueClient's public calls, so the digests merge with the rows' current tags.
    `pending`: a Future of the fields with digest columns (protocol.OverlapsGuard), awaited
    after the lookup; else `fields` has them. Returns the put's KVBatchMeta; its tags still
    hold the digests (the adapter's _clean_meta strips every put's).

    The steps run as one coroutine on the client's own loop, one hand-off to it as
    kv_batch_put makes (TransferQueue's `_run_coroutine`); each of the client's sync calls
    is a hand-off of its own, and a second one shows in a guarded put's time (the figure
    and its command: docs/development/performance.md, "TransferQueue"). A client without
    that runner takes the sync calls."""
    fields_words, tags_words = _length_refusals()  # TransferQueue's checks, in its words
    if fields.batch_size[0] != len(sample_ids):
        raise ValueError(fields_words.format(n=len(sample_ids), m=fields.batch_size[0]))
    if tags is not None and len(tags) != len(sample_ids):
        raise ValueError(tags_words.format(n=len(sample_ids), t=len(tags)))
    run = getattr(client, "_run_coroutine", None)
    if run is not None:
        return run(_put_steps(client, sample_ids, partition_id, fields, tags, data_parser,
                              pending))
    meta = _looked_up(client.kv_retrieve_meta(keys=sample_ids, partition_id=partition_id,
                                              create=True), sample_ids)
    fields = _tagged(meta, fields if pending is None else pending.result(), tags,
                     data_parser)
    return _kv_meta(client.put(fields, meta, **parser_kwargs(data_parser)), sample_ids,
                    partition_id)


async def _put_steps(client, sample_ids, partition_id, fields, tags, data_parser, pending):
    meta = _looked_up(await client.async_kv_retrieve_meta(
        keys=sample_ids, partition_id=partition_id, create=True), sample_ids)
    if pending is not None:
        fields = await asyncio.wrap_future(pending)
    fields = _tagged(meta, fields, tags, data_parser)
    return _kv_meta(await client.async_put(fields, meta, **parser_kwargs(data_parser)),
                    sample_ids, partition_id)


def _looked_up(meta, sample_ids):
    if meta.size != len(sample_ids):
        raise RuntimeError(f"Retrieved BatchMeta size {meta.size} does not match with "
                           f"input `keys` size {len(sample_ids)}!")
    return meta


def _tagged(meta, fields, tags, data_parser):
    """The fields without digest columns; their digests (and `tags`) merged into meta."""
    fields, tags = digests_to_tags(fields, tags, meta.size,
                                   unrecorded=data_parser is not None, current=meta.custom_meta)
    if tags is not None:
        meta.update_custom_meta(tags)
    return fields


def _kv_meta(meta, sample_ids, partition_id):
    from transfer_queue.metadata import KVBatchMeta

    return KVBatchMeta(keys=sample_ids, tags=meta.custom_meta, partition_id=partition_id,
                       fields=meta.field_names, extra_info=meta.extra_info)


def _rewrite_overlaps(current, rows, name: str, keys: tuple, matrix: torch.Tensor) -> None:
    """Into `rows`, the rows' other entries that hold some of `keys`, with those digests
    replaced by the new ones (no entry may keep a stale digest of a rewritten field)."""
    where = {k: j for j, k in enumerate(keys)}
    try:  # the names over all rows at once: most puts overlap no other entry
        present = set().union(*current)
    except TypeError:
        present = None
    if present is not None and not any(
            e != name and where.keys() & (_entry_fields(e) or ()) for e in present
            if isinstance(e, str)):
        return
    for i, (old, row) in enumerate(zip(current, rows)):
        if not isinstance(old, dict):
            continue
        for entry, value in old.items():
            covered = _entry_fields(entry) if entry != name and _is_entry(entry, value) else None
            if not covered or where.keys().isdisjoint(covered) or len(value) != 8 * len(covered):
                continue
            words = np.frombuffer(value, _WORD).copy()
            for t, key in enumerate(covered):
                if key in where:
                    words[t] = int(matrix[i, where[key]])
            row[entry] = words.tobytes()


def digest_columns(td, row_tags: list):
    """`td` (one row per entry of row_tags) with a digest column for each of its fields that
    any row has a digest for; rows without one get the unrecorded sentinel (unverified).
    A field no row has a digest for gets no column: the guard counts it unverified."""
    td = td.exclude(*[k for k in td.keys() if is_digest_field(k)])  # columns of old writers
    n = td.batch_size[0] if td.batch_dims else 0
    if n == 0 or len(row_tags) != n:
        return td
    # entry key -> the column it becomes: each field's digest, and row age's stamp
    wanted = {digest_name(f)[len(DIGEST_PREFIX):]: digest_name(f) for f in td.keys()}
    wanted[STAMP_KEY] = STAMP
    found: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # field -> (digests, have)
    for entry, (rows, values) in sorted(_entries(row_tags).items()):
        covered = _entry_fields(entry)
        if wanted.keys().isdisjoint(covered):
            continue
        width = 8 * len(covered)
        ok = [j for j, v in enumerate(values) if len(v) == width]  # else: unverified
        words = torch.from_numpy(np.frombuffer(b"".join(values[j] for j in ok), _WORD)
                                 .astype(np.int64).reshape(len(ok), len(covered)))
        at = torch.tensor([rows[j] for j in ok], dtype=torch.long)
        for t, key in enumerate(covered):
            if key in wanted:
                digests, have = found.setdefault(wanted[key], (
                    torch.full((n,), UNRECORDED_SENTINEL, dtype=torch.int64),
                    torch.zeros(n, dtype=torch.bool)))
                fresh = ~have[at]  # a row two entries cover: they agree; the first is kept
                digests[at[fresh]] = words[fresh, t]
                have[at] = True
    if not found:
        return td
    td = td.copy()
    td.update({column: digests for column, (digests, _) in found.items()})
    return td


def _entries(row_tags) -> dict[str, tuple[list[int], list[bytes]]]:
    """entry name -> (the rows that have it, their values)."""
    out: dict[str, tuple[list[int], list[bytes]]] = {}
    for i, tag in enumerate(row_tags):
        if not isinstance(tag, dict):
            continue
        for entry, value in tag.items():
            if _is_entry(entry, value):
                rows, values = out.setdefault(entry, ([], []))
                rows.append(i)
                values.append(value)
    return out


def without_digest_tags(tags):
    """A tag dict without the guard's entries (the same dict when it has none)."""
    if not isinstance(tags, dict) or not any(
            isinstance(k, str) and k.startswith(_RESERVED) and is_digest_field(k) for k in tags):
        return tags
    return {k: v for k, v in tags.items() if not is_digest_field(k)}


def strip_digest_tags(rows: list, in_place: bool = False) -> list:
    """Every row's tags without the guard's entries; rows without any are kept as they are.
    The reserved names are found once over all rows, not once per row and name. in_place:
    the dicts are TransferQueue's fresh copies for this call alone, so they lose the
    entries themselves (a third of the time of building new ones)."""
    try:
        names = set().union(*rows)
    except TypeError:  # a row that is not a dict: each one on its own
        return [without_digest_tags(t) for t in rows]
    drop = [k for k in names if is_digest_field(k)]
    if not drop:
        return rows
    if in_place:
        for t in rows:
            for k in drop:
                t.pop(k, None)
        return rows
    gone = set(drop)
    return [t if gone.isdisjoint(t) else {k: v for k, v in t.items() if k not in gone}
            for t in rows]
