import time

import msgpack
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import NonTensorData, NonTensorStack, TensorDict

from dpobs_otel.sizing import encoded_size, payload_nbytes, tensor_nbytes

DTYPES = [torch.float32, torch.bfloat16, torch.bool, torch.int64, torch.float8_e4m3fn,
          torch.complex64, torch.uint8, torch.float16]


def _make(dtype, shape):
    return torch.zeros(shape, dtype=torch.float32).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "sliced", "transposed", "expanded"])
def test_dense_matches_contiguous_nbytes(dtype, layout):
    base = _make(dtype, (6, 10))
    t = {"contiguous": base, "sliced": base[1:5, ::3], "transposed": base.t(),
         "expanded": _make(dtype, (1, 10)).expand(50, 10)}[layout]
    assert tensor_nbytes(t) == t.contiguous().nbytes
    assert payload_nbytes(TensorDict({"f": t}, batch_size=[t.shape[0]])) == t.contiguous().nbytes


def _jagged(lengths, dtype=torch.int64, inner=()):
    rows = [torch.ones((n, *inner), dtype=torch.float32).to(dtype) for n in lengths]
    return torch.nested.nested_tensor(rows, layout=torch.jagged)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bfloat16, torch.bool], ids=str)
def test_jagged_counts_values_not_padding(dtype):
    nt = _jagged([3, 17, 1, 9], dtype, inner=(2,))
    truth = sum(n * 2 for n in [3, 17, 1, 9]) * torch.empty((), dtype=dtype).element_size()
    assert tensor_nbytes(nt) == truth
    assert payload_nbytes(TensorDict({"tok": nt}, batch_size=[4])) == truth


def test_jagged_views_of_a_larger_buffer():
    # Slicing keeps the whole values buffer with offsets[0] > 0; narrow sets _lengths.
    nt = _jagged([3, 5, 2, 4])
    sliced = TensorDict({"t": nt}, batch_size=[4])[1:3]["t"]
    assert tensor_nbytes(sliced) == (5 + 2) * 8
    base = torch.arange(40).reshape(4, 10)
    narrow = torch.nested.narrow(base, 1, torch.tensor([0, 2, 1, 0]), torch.tensor([2, 3, 1, 4]),
                                 layout=torch.jagged)
    assert narrow._lengths is not None
    assert tensor_nbytes(narrow) == (2 + 3 + 1 + 4) * 8 == narrow.contiguous()._values.nbytes


NONTENSOR = ["", "a" * 31, "b" * 32, "c" * 300, "ünïcødé ✓ 漢字", "x" * 70000, 0, 127, 128, 255,
             256, 65535, 65536, 2**32, -1, -32, -33, -128, -129, -(2**31), -(2**40), 1.5,
             True, None, b"", b"\x00" * 300, b"y" * 70000, [1, "two", 3.0],
             {"k": [1, 2, {"deep": "ünï"}], "n": None}, list(range(20)),
             {f"k{i}": i for i in range(20)}, (1, 2)]


@pytest.mark.parametrize("obj", NONTENSOR, ids=lambda o: repr(o)[:20])
def test_nontensor_equals_msgpack(obj):
    assert encoded_size(obj) == len(msgpack.packb(obj))


def test_nontensor_leaves_in_a_tensordict():
    td = TensorDict({"x": torch.zeros(3, 2)}, batch_size=[3])
    td["meta"] = NonTensorData({"step": 7, "tag": "ünï"})
    td["rows"] = NonTensorStack("a", "bb", {"c": [1, 2]})
    td["sub"] = TensorDict({"y": torch.zeros(3, dtype=torch.int8)}, batch_size=[3])
    truth = (24 + 3 + len(msgpack.packb({"step": 7, "tag": "ünï"}))
             + len(msgpack.packb(["a", "bb", {"c": [1, 2]}])))
    assert payload_nbytes(td) == truth


def test_large_stack_is_sampled_within_tolerance():
    rows = [f"message {i} " * (1 + i % 5) for i in range(4096)]
    td = TensorDict({}, batch_size=[len(rows)])
    td["log"] = NonTensorStack.from_list(rows)
    truth = len(msgpack.packb(rows))
    assert abs(payload_nbytes(td) - truth) / truth < 0.02


def test_node_budget_bounds_the_walk():
    small, big = list(range(10_000)), list(range(2_000_000))
    t0 = time.perf_counter()
    encoded_size(small)
    t_small = time.perf_counter() - t0
    t0 = time.perf_counter()
    est = encoded_size(big)
    t_big = time.perf_counter() - t0
    assert t_big < 20 * t_small + 0.01  # 200x the data, nowhere near 200x the time
    truth = len(msgpack.packb(big))
    assert abs(est - truth) / truth < 0.1
    nested = [[list(range(100)) for _ in range(100)] for _ in range(100)]  # 1M leaves
    assert abs(encoded_size(nested) - len(msgpack.packb(nested))) / len(msgpack.packb(nested)) < 0.1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=40) | st.binary(max_size=40),
    lambda kids: st.lists(kids, max_size=6) | st.dictionaries(st.text(max_size=8), kids, max_size=6),
    max_leaves=30)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_nontensor_exact_within_budget(obj):
    assert encoded_size(obj) == len(msgpack.packb(obj))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=1, max_size=8),
       st.sampled_from(DTYPES), st.integers(1, 3))
def test_random_tensordicts_exact(lengths, dtype, width):
    n = len(lengths)
    dense = _make(dtype, (n, width))
    td = TensorDict({"d": dense, "t": dense.t().contiguous().t()}, batch_size=[n])
    truth = 2 * dense.nbytes
    if len(set(lengths)) > 1 and min(lengths) > 0:
        nt = _jagged(lengths, dtype)
        td["j"] = nt
        truth += sum(lengths) * dense.element_size()
    assert payload_nbytes(td) == truth
