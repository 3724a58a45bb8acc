"""The wire guard's digests on TransferQueue: carried in the rows' tags, not as columns.

The guard hands the data plane one digest column per tensor field (`__dpobs_digest__:<field>`,
int64 (N,)). TransferQueue stores and gathers every field row by row, so those columns
doubled the fields a guarded put writes and a guarded read fetches: get took 1.85x as long as
bare on a 4-field batch, of which the guard's own arithmetic was a small part. TransferQueue
also keeps per-row tags (its `custom_meta`): a put sends them to the controller in the same
request that registers the rows, and a read fetches them with the metadata it looks up
before any data moves. So on TransferQueue the digests travel as tags, `{digest name: int}`
per row, and cost no extra field, request or round trip.

Tags are merged per key (`dict.update`), which keeps every case the columns handled:
  * a delta write (new fields for existing keys) adds its fields' digests, keeps the others';
  * a rewrite of one field replaces that field's digest only;
  * a read of any subset of fields finds each field's digest, whatever else was selected;
  * a row written without the guard has no digest tag: counted unverified, per row, while
    the digested rows of the same read are checked (a mixed read no longer falls back whole);
  * kv_clear drops a key with its tags.
The tags never reach the caller: `kv_list` and the KVBatchMeta of a put leave them out.
"""
from __future__ import annotations

import torch

from ..guard import NONTENSOR_SENTINEL, UNRECORDED_SENTINEL, digest_name, is_digest_field

_ABSENT = object()


def digests_to_tags(fields, tags, n: int, unrecorded: bool = False):
    """(fields without the guard's digest columns, tags carrying them), for a put of n rows.

    unrecorded: the values will change inside TransferQueue (a data_parser), so the rows get
    the "unrecorded" sentinel: readers count them unverified, never corrupt, and a digest
    left by an earlier put of the same key is overwritten."""
    names = [k for k in fields.keys() if is_digest_field(k)]
    if not names:
        return fields, tags
    bare = fields.exclude(*names)
    if tags is not None and len(tags) != n:
        return bare, tags  # TransferQueue refuses the lengths itself, in its own words
    # A non-tensor field's column holds only its sentinel, and readers never check such a
    # field: its tag would cost every row an entry (TransferQueue deep-copies each row's
    # tags several times per call) and tell nothing.
    names = [k for k in names if not bool((fields.get(k) == NONTENSOR_SENTINEL).all())]
    if not names:
        return bare, tags
    if unrecorded:
        rows = [dict.fromkeys(names, UNRECORDED_SENTINEL) for _ in range(n)]
    else:
        # One (N, F) stack and one tolist: a Python int per row and field, no per-row tensors.
        values = torch.stack([fields.get(k).to("cpu", torch.int64) for k in names], 1).tolist()
        rows = [dict(zip(names, row)) for row in values]
    if tags is not None:
        rows = [{**tag, **row} for tag, row in zip(tags, rows)]
    return bare, rows


def digest_columns(td, row_tags: list):
    """`td` (one row per entry of row_tags) with a digest column for each of its fields that
    any row has a digest tag for; rows without one get the unrecorded sentinel (unverified).
    A field no row has a digest for gets no column: the guard counts it unverified."""
    td = td.exclude(*[k for k in td.keys() if is_digest_field(k)])  # columns of old writers
    n = td.batch_size[0] if td.batch_dims else 0
    if n == 0 or len(row_tags) != n:
        return td
    columns = {}
    for field in td.keys():
        name = digest_name(field)
        values = [tag.get(name, _ABSENT) for tag in row_tags]
        if all(v is _ABSENT for v in values):
            continue
        columns[name] = torch.tensor([UNRECORDED_SENTINEL if v is _ABSENT else v
                                      for v in values], dtype=torch.int64)
    if columns:
        td = td.copy()
        td.update(columns)
    return td


def without_digest_tags(tags):
    """A tag dict without the guard's entries (the same dict when it has none)."""
    if not isinstance(tags, dict) or not any(is_digest_field(k) for k in tags):
        return tags
    return {k: v for k, v in tags.items() if not is_digest_field(k)}
