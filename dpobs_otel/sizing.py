"""Exact payload byte accounting, on the hot path of every put and get.

Tensors count what `t.contiguous().nbytes` would be: the logical size, whatever the
strides (a stride-0 expanded view counts every element it shows). Non-tensor payload, one
rule whatever the store: what msgpack encodes counts its msgpack size; a buffer-protocol
object (numpy array, bytearray, memoryview) or a tensor counts its nbytes; anything else
counts its pickle (protocol 5) size, out-of-band buffers at their nbytes. Never a string's
length. One traversal per payload, dispatching on exact types, because isinstance chains
and tensorclass attribute probes dominate at this scale.
"""
from __future__ import annotations

import contextlib
import ctypes
import pickle

import msgpack
import torch

from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from .shims import torch_jagged

try:  # the jagged layout's tensor subclass; absent on very old torch
    from torch.nested._internal.nested_tensor import NestedTensor as _Jagged
except ImportError:  # pragma: no cover
    _Jagged = None

# Past this many nodes a non-tensor walk stops measuring and extrapolates.
NODE_BUDGET = 4096
# Rows of a large NonTensorStack (and elements of a large container) measured for the estimate.
SAMPLE_ROWS = 32


def tensor_nbytes(t: torch.Tensor) -> int:
    """Logical bytes of a tensor: t.contiguous().nbytes without making the copy."""
    if type(t) is torch.Tensor:
        return t.nbytes  # strided and strided-nested tensors: numel * element_size
    if _Jagged is not None and type(t) is _Jagged:
        return _jagged_nbytes(t)
    return t.numel() * t.element_size()  # other subclasses: the public, slower path


def _jagged_nbytes(t) -> int:
    # A jagged tensor's public numel/nbytes dispatch through __torch_function__; the values
    # buffer answers two orders of magnitude faster (docs/development/performance.md). The buffer may view
    # a larger allocation (torch.nested.narrow sets _lengths; a view of some rows leaves
    # offsets[0] > 0), so the row span comes from the offsets, never from the buffer's length.
    values = torch_jagged.values(t)
    if not values.is_cpu:
        # Metadata only: an accelerator's offsets would cost a host sync per field, so a
        # device tensor counts the values buffer its rows view (DESIGN: "a nested tensor's
        # values buffer"), all of it even for a view of some rows.
        rows = values.shape[0]
    else:
        lengths = torch_jagged.lengths(t)
        rows = int(lengths.sum()) if lengths is not None else _offsets_span(torch_jagged.offsets(t))
    per_row = values.element_size()
    if values.dim() > 1:  # slicing a shape costs more than the common 1-d case's check
        for d in values.shape[1:]:
            per_row *= d
    return rows * per_row


_I64 = ctypes.c_int64


def _offsets_span(off: torch.Tensor) -> int:
    """offsets[-1] - offsets[0], read in place from a contiguous int64 CPU tensor (the tensor
    stays alive for the read): cheaper than indexing it twice (docs/development/performance.md)."""
    if off.is_cpu and off.dtype is torch.int64 and off.is_contiguous():
        p = off.data_ptr()
        return _I64.from_address(p + 8 * (off.shape[0] - 1)).value - _I64.from_address(p).value
    return int(off[-1] - off[0])  # a CPU tensor of another dtype or layout


def is_payload(obj) -> bool:
    """A TensorDict: the only thing sizing walks. Anything else (None, a dict, a list, a
    generator) is never iterated, so a generator handed to dpobs reaches its caller unspent."""
    return type(obj) is TensorDict or isinstance(obj, TensorDictBase)


def payload_nbytes(td) -> int:
    """Bytes of a TensorDict payload: tensor leaves plus non-tensor leaves, in one walk;
    0 for anything that is not a TensorDict (is_payload)."""
    if not is_payload(td):
        return 0
    total = 0
    for _, v in td.items():
        tv = type(v)  # the two common leaves inline: this runs on every put and get
        if tv is _Jagged:
            total += _jagged_nbytes(v)
        elif tv is torch.Tensor:
            total += v.nbytes
        else:
            total += _value_nbytes(v)
    return total


def field_nbytes(td) -> dict[str, int]:
    """{top-level field: bytes} of a TensorDict payload (a nested TensorDict is one field):
    what occupancy needs to replace a field's bytes when a put overwrites it; {} for anything
    that is not a TensorDict."""
    if not is_payload(td):
        return {}
    out = {}
    for k, v in td.items():
        tv = type(v)
        out[k] = (_jagged_nbytes(v) if tv is _Jagged else v.nbytes if tv is torch.Tensor
                  else _value_nbytes(v))
    return out


def _value_nbytes(v) -> int:
    # td.items(leaves_only=True) would silently skip non-tensor leaves, hence one level here.
    tv = type(v)
    if tv is torch.Tensor:
        return v.nbytes
    if tv is _Jagged:
        return _jagged_nbytes(v)
    if tv is NonTensorData:
        return encoded_size(_row_value(v))
    if tv is NonTensorStack:
        return _stack_size(v)
    if isinstance(v, TensorDictBase):
        return payload_nbytes(v)
    if isinstance(v, torch.Tensor):
        return tensor_nbytes(v)
    return encoded_size(v)


def _stack_size(stack) -> int:
    """A NonTensorStack at the size of msgpack(list of its rows); large stacks by strided sample."""
    rows = stack.tensordicts
    n = len(rows)
    if n <= SAMPLE_ROWS:
        picked = rows
    else:
        step = n / SAMPLE_ROWS
        picked = [rows[int(i * step)] for i in range(SAMPLE_ROWS)]
    values = [_row_value(r) for r in picked]
    measured = None
    if _SCALARS.issuperset(map(type, values)) or all(map(_flat, values)):
        # One C call measures the whole sample: packb(list) = header + the rows.
        with contextlib.suppress(TypeError, ValueError, OverflowError):  # e.g. a lone surrogate
            measured = len(_packb(values)) - _container_header(len(values))
    if measured is None:
        measured = sum(_row_size(r, v) for r, v in zip(picked, values))
    return _container_header(n) + (measured if n <= SAMPLE_ROWS
                                   else round(measured * n / SAMPLE_ROWS))


def _row_value(row):
    # NonTensorData.data goes through tensorclass attribute dispatch; the value sits in its
    # non-tensor dict, ten times cheaper to read (docs/development/performance.md). Fall back to the public attribute if that moves.
    if type(row) is NonTensorData:
        nt = getattr(row, "_non_tensordict", None)
        return nt["data"] if nt is not None and "data" in nt else row.data
    return row


def _row_size(row, value) -> int:
    if type(row) is NonTensorData:
        return encoded_size(value)
    if type(row) is NonTensorStack:
        return _stack_size(row)
    return payload_nbytes(row)


_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})
_STR = frozenset({str})
FLAT_MAX = 64  # a flat container this small is measured by msgpack itself


def _flat(o) -> bool:
    """A dict/list/tuple of at most FLAT_MAX msgpack scalars: cheap to encode, so exact."""
    t = type(o)  # set operations over map(type, ...) run in C: half the cost of all(...)
    if t is dict:
        return len(o) <= FLAT_MAX and _STR.issuperset(map(type, o)) and \
            _SCALARS.issuperset(map(type, o.values()))
    if t is list or t is tuple:
        return len(o) <= FLAT_MAX and _SCALARS.issuperset(map(type, o))
    return False


def _packb(obj) -> bytes:
    return msgpack.packb(obj)


# Nesting deeper than this is handed to msgpack itself (which refuses past 511 levels), so
# the walk's own recursion stays far from Python's limit.
MAX_DEPTH = 100


class _Budget:
    __slots__ = ("left", "depth")

    def __init__(self, left: int):
        self.left = left
        self.depth = 0


def encoded_size(obj, budget: int = NODE_BUDGET) -> int:
    """len(msgpack.packb(obj)), bounded: a scalar or a small flat container is measured by
    msgpack's C encoder (faster than any walk); anything else by a walk that is exact while
    under `budget` nodes, then extrapolates, so the cost follows the budget, not the data."""
    if type(obj) is str and obj.isascii():  # the common non-tensor leaf, without a walk
        return _str_size(len(obj))
    if _flat(obj):
        try:
            return len(_packb(obj))
        except (TypeError, ValueError, OverflowError):  # e.g. a lone surrogate in a str
            pass
    try:
        return _size(obj, _Budget(budget))
    except _TooDeep:
        return opaque_size(obj)


def _size(o, b: _Budget) -> int:
    b.left -= 1
    t = type(o)
    if t is str:
        if o.isascii():
            n = len(o)
        else:
            try:
                n = len(o.encode("utf-8"))
            except UnicodeEncodeError:  # a lone surrogate: msgpack cannot encode it either
                return opaque_size(o)
        return _str_size(n)
    if t is int:
        return _int_size(o)
    if t is float:
        return 9  # msgpack-python packs every float as a float64
    if o is None or t is bool:
        return 1
    if t is bytes or t is bytearray or t is memoryview:
        n = len(o) if t is not memoryview else o.nbytes
        return n + (2 if n < 256 else 3 if n < 65536 else 5)
    if t is list or t is tuple or t is dict:
        if b.depth >= MAX_DEPTH:
            return _deep_size(o)
        b.depth += 1
        try:
            if t is dict:
                return (_container_header(len(o)) + _items_size(o.keys(), b)
                        + _items_size(o.values(), b))
            return _container_header(len(o)) + _items_size(o, b)
        finally:
            b.depth -= 1
    if isinstance(o, torch.Tensor):
        return tensor_nbytes(o)
    if t is NonTensorData:
        return _size(_row_value(o), b)
    if t is NonTensorStack:
        return _stack_size(o)
    if isinstance(o, (int, float, str, bytes)):  # subclasses (IntEnum, numpy scalars that subclass)
        return _size(_base_value(o), b)
    return opaque_size(o)


def _base_value(o):
    for base in (int, float, str):  # bool is an int subclass but has an exact-type branch
        if isinstance(o, base):
            return base(o)
    return bytes(o)


class _TooDeep(Exception):
    """msgpack refused a subtree's nesting, so it cannot encode the value holding it either."""


def _deep_size(o) -> int:
    """A subtree past MAX_DEPTH: msgpack measures it when it can encode it, else pickle. A
    subtree msgpack refuses for its nesting alone raises _TooDeep: the whole value is then
    opaque (encoded_size), not this subtree pickled beneath a msgpack-sized rest."""
    try:
        return len(_packb(o))
    except ValueError as exc:
        if "recursion" in str(exc):
            raise _TooDeep from exc
        return opaque_size(o)
    except (TypeError, OverflowError):
        return opaque_size(o)


def opaque_size(o) -> int:
    """An object msgpack cannot encode: a buffer-protocol object counts its nbytes; anything
    else its pickle protocol 5 size, with out-of-band buffers (numpy arrays inside an object,
    say) at their nbytes. Raises when the object cannot be pickled: the caller counts that
    as a sizing failure, never as some made-up size."""
    try:
        return memoryview(o).nbytes
    except (TypeError, ValueError):  # ValueError: e.g. a numpy array of Python objects
        pass
    buffers: list[pickle.PickleBuffer] = []
    n = len(pickle.dumps(o, protocol=5, buffer_callback=buffers.append))
    return n + sum(memoryview(buf).nbytes for buf in buffers)


def _items_size(items, b: _Budget) -> int:
    n = len(items)
    if n == 0:
        return 0
    if n > b.left and n > SAMPLE_ROWS:
        # Not enough budget to walk it all: a strided sample scaled to the whole.
        seq = items if isinstance(items, (list, tuple)) else list(items)
        step = n / SAMPLE_ROWS
        measured = sum(_size(seq[int(i * step)], b) for i in range(SAMPLE_ROWS))
        return round(measured * n / SAMPLE_ROWS)
    total = 0
    for i, x in enumerate(items):
        if b.left <= 0 and i:  # budget spent: extrapolate from the prefix (at least one item)
            return round(total * n / i)
        total += _size(x, b)
    return total


def _int_size(v: int) -> int:
    if 0 <= v < 128 or -32 <= v < 0:
        return 1
    if v > 0:
        return 2 if v < 1 << 8 else 3 if v < 1 << 16 else 5 if v < 1 << 32 else 9
    return 2 if v >= -(1 << 7) else 3 if v >= -(1 << 15) else 5 if v >= -(1 << 31) else 9


def _str_size(n: int) -> int:
    """msgpack's size of a str of n UTF-8 bytes: the bytes and their header."""
    return n + (1 if n < 32 else 2 if n < 256 else 3 if n < 65536 else 5)


def _container_header(n: int) -> int:
    return 1 if n < 16 else 3 if n < 65536 else 5


