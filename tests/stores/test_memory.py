import threading

import pytest
import torch
from helpers.payloads import three_rows as _batch  # the Mooncake tests mirror these cases
from helpers.rowsel import HOWS, row_numbers, take_rows
from tensordict import NonTensorData, NonTensorStack, TensorDict, is_non_tensor

from dpobs_otel import InMemoryDataPlane, connect_store, serve_store
from dpobs_otel.shims import torch_jagged

IDS = ["a", "b", "c"]


def test_round_trip_keeps_jagged_dense_and_nontensor():
    s = InMemoryDataPlane()
    s.put_samples(IDS, "p", _batch())
    out = s.get_samples(["c", "a"], "p")
    assert out.batch_size == torch.Size([2])
    assert out["tok"].is_nested
    assert [r.tolist() for r in out["tok"].unbind()] == [[0, 1, 2], [0, 1]]
    assert torch.equal(out["adv"], torch.tensor([[5.0, 6.0], [1.0, 2.0]]))
    assert out.get("meta").tolist() == ["z", "x"]


def test_a_read_of_no_rows_has_each_selected_field_empty():
    # Nothing tells a column's type without a row: every field comes back as an empty
    # non-tensor column of batch (0,), on every tensordict (0.10 cannot hold an empty
    # NonTensorStack: rows.assemble).
    s = InMemoryDataPlane()
    s.put_samples(IDS, "p", _batch())
    out = s.get_samples([], "p", ["tok", "adv", "meta"])
    assert out.batch_size == torch.Size([0])
    assert list(out.keys()) == ["tok", "adv", "meta"]
    for key in out.keys():
        assert is_non_tensor(out.get(key)) and out.get(key).tolist() == []
    assert list(s.get_samples([], "p").keys()) == []


EMPTYISH = {"all_empty": [[], [], []], "nested_empty": [[[]], [[]], [[]]],
            "some_empty": [[1], [], [2, 3]], "empty_in_dict": [{"k": []}, {"k": []}, {}]}


@pytest.mark.parametrize("rows", EMPTYISH)
def test_non_tensor_rows_of_empty_lists_read_back_as_written(rows):
    # from_list makes a stack with a 0 in its shape of rows that are all empty lists, which
    # tensordict 0.10 cannot set into a TensorDict (rows.assemble); the put's batch holds
    # each row whole, which every tensordict can.
    values = EMPTYISH[rows]
    meta = NonTensorStack(*[NonTensorData(data=v, batch_size=[]) for v in values])
    s = InMemoryDataPlane()
    s.put_samples(IDS, "p", TensorDict({"meta": meta}, [3]))
    assert s.get_samples(IDS, "p").get("meta").tolist() == values
    assert s.get_samples(["c", "a"], "p", ["meta"]).get("meta").tolist() == [values[2],
                                                                            values[0]]
    assert s.get_samples(["b"], "p").get("meta").tolist() == [values[1]]


def test_uniform_jagged_rows_come_back_dense():
    s = InMemoryDataPlane()
    tok = torch.nested.nested_tensor([torch.arange(4), torch.arange(4) + 1], layout=torch.jagged)
    s.put_samples(["a", "b"], "p", TensorDict({"tok": tok}, batch_size=[2]))
    out = s.get_samples(["a", "b"], "p")["tok"]
    assert not out.is_nested and out.tolist() == [[0, 1, 2, 3], [1, 2, 3, 4]]


def test_select_fields_and_delta_writes():
    s = InMemoryDataPlane()
    s.put_samples(IDS, "p", _batch())
    s.put_samples(["b"], "p", TensorDict({"extra": torch.tensor([9])}, batch_size=[1]))
    assert set(s.get_samples(["b"], "p").keys()) == {"tok", "adv", "meta", "extra"}
    assert set(s.get_samples(IDS, "p").keys()) == {"tok", "adv", "meta"}  # common fields only
    assert list(s.get_samples(["a"], "p", ["adv"]).keys()) == ["adv"]
    with pytest.raises(KeyError, match="extra.*'a'"):
        s.get_samples(["a", "b"], "p", ["extra"])


def test_store_copies_the_callers_buffers():
    s = InMemoryDataPlane()
    td = _batch()
    s.put_samples(IDS, "p", td)
    td["adv"].zero_()
    assert s.get_samples(["a"], "p")["adv"].tolist() == [[1.0, 2.0]]


def test_missing_id_and_partition_name_themselves():
    s = InMemoryDataPlane()
    s.put_samples(IDS, "p", _batch())
    with pytest.raises(KeyError, match="'zz'.*'p'"):
        s.get_samples(["a", "zz"], "p")
    with pytest.raises(KeyError, match="'nope'"):
        s.get_samples(["a"], "nope")
    with pytest.raises(ValueError, match="batch size"):
        s.put_samples(["a"], "p", _batch())


def test_clear_subset_and_whole_partition():
    s = InMemoryDataPlane()
    s.put_samples(IDS, "p", _batch())
    s.clear_samples(["b"], "p")
    assert s.list_sample_ids("p") == ["a", "c"]
    s.clear_samples(None, "p")
    assert s.list_sample_ids("p") == []


def test_claim_meta_hands_each_id_once_per_consumer():
    s = InMemoryDataPlane()
    s.put_samples(IDS, "p", _batch())
    assert s.claim_meta("p", 2) == ["a", "b"]
    assert s.claim_meta("p", 2) == ["c"]
    assert s.claim_meta("p", 5, consumer="other") == IDS


def test_thread_safe_puts():
    s = InMemoryDataPlane()

    def writer(k):
        for i in range(50):
            s.put_samples([f"{k}-{i}"], "p", TensorDict({"x": torch.ones(1, 2)}, batch_size=[1]))
    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(s.list_sample_ids("p")) == 200


def test_served_store_moves_bytes_between_processes():
    mgr, address = serve_store()
    try:
        a, b = connect_store(address), connect_store(address)
        a.put_samples(IDS, "p", _batch())
        out = b.get_samples(IDS, "p", ["tok"])
        assert [len(r) for r in out["tok"].unbind()] == [2, 5, 3]
        with pytest.raises(KeyError):
            b.get_samples(["zz"], "p")
    finally:
        mgr.shutdown()


# -- row subsets of a batch with a jagged field (helpers/rowsel.py): tensordict 0.10 cannot
# make them itself; the store must take every layout a caller can -------------------------
TOK = [[7, 1, 9], [4], [2, 8, 6, 5, 3], [0, 11], [12, 13, 14, 15]]
SUBSETS = {"middle": slice(1, 3), "tail": slice(2, None), "picked": [4, 0, 2]}


def _five_rows():
    tok = torch.nested.nested_tensor([torch.tensor(r) for r in TOK], layout=torch.jagged)
    adv = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    return TensorDict({"tok": tok, "adv": adv, "meta": NonTensorStack(*"vwxyz")}, batch_size=[5])


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("subset", SUBSETS)
def test_row_subsets_of_a_jagged_batch_round_trip(how, subset):
    rows = row_numbers(5, SUBSETS[subset])
    sub = take_rows(_five_rows(), SUBSETS[subset], how)
    if how == "by_field" and isinstance(SUBSETS[subset], slice):  # a view of all five rows
        assert torch_jagged.offsets(sub["tok"])[0] > 0
        assert torch_jagged.values(sub["tok"]).numel() == sum(map(len, TOK))
    ids = [f"r{i}" for i in rows]
    s = InMemoryDataPlane()
    s.put_samples(ids, "p", sub)
    torch_jagged.values(sub["tok"]).add_(100)  # the store kept its own copy of just these rows
    back = ids[::-1]
    out = s.get_samples(back, "p")
    want = [TOK[int(sid[1:])] for sid in back]
    got = out["tok"].unbind() if out["tok"].is_nested else list(out["tok"])
    assert [r.tolist() for r in got] == want
    assert out["adv"].tolist() == [[2.0 * int(sid[1:]), 2.0 * int(sid[1:]) + 1] for sid in back]
    assert out.get("meta").tolist() == ["vwxyz"[int(sid[1:])] for sid in back]
    stored = sum(s._rows["p"][sid][("tok",)].numel() for sid in ids)
    assert stored == sum(len(TOK[i]) for i in rows)  # rows' own values, not the whole buffer
