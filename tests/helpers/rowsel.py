"""Row subsets of a batch with a jagged field, on every tensordict the suite supports.

tensordict 0.10's `td[1:]` and `td[[i, j]]` raise on a jagged field: they hand the index to
the jagged tensor, and torch has no dim-0 slice or index of one. tensordict 0.15 gathers the
rows itself. The store and the guard never select rows of a caller's batch; they must read
whatever subset a caller built. So the tests build subsets both ways: with tensordict where
it can, and field by field (by_field), which works everywhere and, for a slice, makes the
layout torch itself gives a view of a larger batch (offsets[0] > 0, unused values after the
last row) rather than the compact copy tensordict 0.15 makes.
"""
from __future__ import annotations

import pytest
import tensordict
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from dpobs_otel.shims import torch_jagged

HOWS = ("tensordict", "by_field")
TD_SLICES_JAGGED = tuple(int(p) for p in tensordict.__version__.split(".")[:2]) >= (0, 15)


def take_rows(td: TensorDictBase, index, how: str) -> TensorDictBase:
    """td's rows `index` (a step-1 slice or a list of row numbers), made `how`. A tensordict
    that cannot slice a jagged field skips the test where the suite's version (0.15) can."""
    if how == "by_field":
        return by_field(td, index)
    try:
        return td[index]
    except (RuntimeError, NotImplementedError) as exc:
        if TD_SLICES_JAGGED:
            raise
        pytest.skip(f"tensordict {tensordict.__version__} cannot select rows of a jagged "
                    f"field ({type(exc).__name__})")


def by_field(td: TensorDictBase, index) -> TensorDict:
    """td[index], field by field."""
    rows = row_numbers(td.batch_size[0], index)
    out = TensorDict({}, batch_size=[len(rows)])
    for key, value in td.items():
        if isinstance(value, (NonTensorData, NonTensorStack)):
            values = value.tolist()
            out.set(key, NonTensorStack.from_list([values[i] for i in rows]))
        elif isinstance(value, TensorDictBase):
            out.set(key, by_field(value, index))
        elif torch_jagged.is_jagged(value):
            out.set(key, _jagged_rows(value, index, rows))
        else:
            out.set(key, _dense_rows(value, index, rows))
    return out


def _dense_rows(value: torch.Tensor, index, rows) -> torch.Tensor:
    if isinstance(index, slice):
        return value[index]
    try:
        return value[torch.tensor(rows)]
    except NotImplementedError:  # torch before 2.10 has no CPU index kernel for float8
        return value.view(torch.uint8)[torch.tensor(rows)].view(value.dtype)


def row_numbers(n: int, index):
    """The row numbers index selects of n rows (a range for a slice)."""
    return range(n)[index] if isinstance(index, slice) else list(index)


def _jagged_rows(nt: torch.Tensor, index, rows) -> torch.Tensor:
    if isinstance(index, slice) and torch_jagged.tiles_values(nt) and rows.step == 1:
        # a view: the same values buffer, offsets of just these rows
        off = torch_jagged.offsets(nt)[rows.start:rows.stop + 1]
        return torch.nested.nested_tensor_from_jagged(torch_jagged.values(nt), off)
    parts = nt.unbind()
    return torch.nested.as_nested_tensor([parts[i] for i in rows], layout=torch.jagged)
