"""Payloads every data plane's tests share: the in-memory store's three-row batch (jagged,
dense and non-tensor), which the Mooncake tests mirror, and the core suite's hypothesis
strategy of random payloads with their exact byte counts."""
from __future__ import annotations

import msgpack
import torch
from hypothesis import strategies as st
from tensordict import NonTensorData, NonTensorStack, TensorDict


def three_rows():
    tok = torch.nested.nested_tensor([torch.arange(n) for n in (2, 5, 3)], layout=torch.jagged)
    td = TensorDict({"tok": tok, "adv": torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])},
                    batch_size=[3])
    td["meta"] = NonTensorStack("x", "y", "z")
    return td


leaf_values = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
                        st.floats(allow_nan=False), st.text(max_size=20), st.binary(max_size=20),
                        st.lists(st.integers(0, 9), max_size=5),
                        st.builds(object))  # not msgpack-native: counted by its text
dtypes = st.sampled_from([torch.float32, torch.bfloat16, torch.bool, torch.int64,
                          torch.float8_e4m3fn, torch.complex64, torch.uint8])


@st.composite
def payloads(draw):
    n = draw(st.integers(1, 6))
    td, truth = TensorDict({}, batch_size=[n]), 0
    for i in range(draw(st.integers(0, 3))):
        shape = (n, *draw(st.lists(st.integers(0, 4), max_size=2)))
        t = torch.zeros(shape).to(draw(dtypes))
        if draw(st.booleans()) and t.dim() > 1:
            t = t.transpose(0, 1).contiguous().transpose(0, 1)  # non-contiguous view
        td[f"d{i}"] = t
        truth += t.contiguous().nbytes
    if draw(st.booleans()):
        lengths = draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
        td["j"] = torch.nested.nested_tensor([torch.ones(k) for k in lengths], layout=torch.jagged)
        truth += sum(lengths) * 4
    exact = True
    if draw(st.booleans()):
        v = draw(leaf_values)
        td["meta"] = NonTensorData(v)
        if type(v) is object:
            exact = False
        else:
            truth += len(msgpack.packb(v))
    return td, truth, exact
