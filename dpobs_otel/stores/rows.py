"""Rows of a TensorDict as a key-value store keeps them, shared by every store that splits a
batch into per-row values (stores.memory, adapters.mooncake): the put's checks, the split
into per-row columns, which fields a read returns, and a column put back together."""
from __future__ import annotations

import functools

import numpy as np
import torch

from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from ..shims import torch_jagged

Key = tuple[str, ...]  # a field name, nested keys flattened to a path
STAMP_KEY = "stamp"  # where a row dict keeps row age's stamp: a str, so never a field's Key


def check_put(sample_ids, fields, tags) -> list[str]:
    """The put's arguments, checked before anything is stored; returns the ids as a list."""
    ids = check_ids(sample_ids)
    if fields is not None and fields.batch_size[:1] != torch.Size([len(ids)]):
        raise ValueError(f"fields has batch size {tuple(fields.batch_size)}, "
                         f"expected ({len(ids)},) for {len(ids)} sample ids")
    if tags is not None and len(tags) != len(ids):
        raise ValueError(f"{len(tags)} tags for {len(ids)} sample ids")
    return ids


def check_ids(sample_ids) -> list[str]:
    if isinstance(sample_ids, (str, bytes)) or not hasattr(sample_ids, "__iter__"):
        raise TypeError(f"sample_ids must be a list of str, got {type(sample_ids).__name__}")
    ids = list(sample_ids)
    if len(set(ids)) != len(ids):
        raise ValueError("sample_ids contains duplicates")
    return ids


def split_columns(td: TensorDictBase, prefix: Key = ()) -> dict[Key, list]:
    """Field -> one stored value per row. Rows are views of a private copy (so the caller
    may reuse its buffers), made with one copy per field rather than one per row. They come
    from each field's own buffers, never from indexing the batch: tensordict 0.10 raises on
    td[i:j] or td[ids] of a batch with a jagged field."""
    n = td.batch_size[0]
    out: dict[Key, list] = {}
    for name, v in td.items():
        key = prefix + (name,)
        if isinstance(v, (NonTensorData, NonTensorStack)):
            values = v.tolist()
            out[key] = values if isinstance(values, list) and len(values) == n else [values] * n
        elif isinstance(v, TensorDictBase):
            out.update(split_columns(v, key))
        elif v.is_nested:
            if torch_jagged.lengths(v) is not None:  # a narrowed view: gather each row's own span
                out[key] = [r.clone() for r in v.unbind()]
            else:
                off = v.offsets()
                values = v.values()[int(off[0]):int(off[-1])].clone()
                out[key] = list(torch.split(values, off.diff().tolist()))
        else:
            out[key] = list(v.detach().clone().unbind(0))
    return out


def selected_keys(rows: list[dict], select_fields) -> list[Key]:
    if select_fields is not None:
        return [f if isinstance(f, tuple) else (f,) for f in select_fields]
    if not rows:
        return []
    common = set(rows[0])
    for row in rows[1:]:
        common &= row.keys()
    # first row's order, fields every row has; row age's stamp is no field (read_stamps)
    return [k for k in rows[0] if k in common and k != STAMP_KEY]


def assemble(values: list):
    """One field's column from its rows: dense when every row has one shape, jagged when they
    differ, a non-tensor stack otherwise (and for a read of no rows: nothing tells its type)."""
    first = values[0] if values else None
    if not isinstance(first, torch.Tensor):
        return _non_tensor_column(values)
    if all(v.shape == first.shape for v in values):
        return torch.stack(values)
    return torch.nested.as_nested_tensor(values, layout=torch.jagged)


def _non_tensor_column(values: list):
    """NonTensorStack.from_list(values), or where tensordict cannot hold that stack (0.10,
    see _zero_size_stacks_settable), a column that reads back the same rows (tolist()): each
    row kept whole as one NonTensorData, or for no rows an empty NonTensorData of batch (0,)."""
    stack = NonTensorStack.from_list(values)
    if 0 not in stack.batch_size or _zero_size_stacks_settable():
        return stack
    if not values:
        return NonTensorData(data=[], batch_size=[0])
    return NonTensorStack(*[NonTensorData(data=v, batch_size=[]) for v in values])


@functools.cache
def _zero_size_stacks_settable() -> bool:
    # from_list nests list rows into the stack's shape: a read of no rows, or rows that are
    # all empty lists, make a 0 in it. tensordict 0.10's set() reads such a stack's names
    # through its first (absent) element and raises IndexError; 0.15 takes it. Asked once.
    try:
        TensorDict({}, batch_size=[1]).set("f", NonTensorStack.from_list([[]]))
    except IndexError:
        return False
    return True


# -- row age's stamp (rowage.py): a per-row int beside the fields, never a field itself ---
def _stamp_name() -> str:
    from ..rowage import STAMP  # lazy: a store without row age never loads it

    return STAMP


def take_stamps(fields):
    """(fields without row age's stamp column, its values as ints) for a put; (fields, None)
    when it has none."""
    stamp = _stamp_name()
    if fields is None or stamp not in fields.keys():
        return fields, None
    return fields.exclude(stamp), fields.get(stamp).tolist()


def read_stamps(select_fields, stamps_of):
    """(the select without the stamp column, the read's stamp column or None) from the rows'
    stamps (stamps_of(): a list, None where a row has none; called only when needed): the
    column when the select names it, or on a full read when any row has a stamp,
    NOT_STAMPED for rows without one, so that a reader counts each row as it is instead of a
    refusal of the whole read."""
    from ..rowage import NOT_STAMPED

    stamp = _stamp_name()
    if select_fields is not None and stamp not in select_fields:
        return select_fields, None
    stamps = stamps_of()
    if select_fields is not None:
        select_fields = [f for f in select_fields if f != stamp]
    elif all(s is None for s in stamps):
        return None, None
    if None in stamps:
        stamps = [NOT_STAMPED if s is None else s for s in stamps]
    return select_fields, torch.from_numpy(np.array(stamps, dtype=np.int64))
