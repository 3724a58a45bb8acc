"""The guard's digests as TransferQueue row tags: one entry per write, merged on rewrites."""
from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from dpobs_otel.adapters.transferqueue.digests import (digest_columns, digests_to_tags,
                                                      strip_digest_tags, without_digest_tags)
from dpobs_otel.guard import (DIGEST_PREFIX, NONTENSOR_SENTINEL, UNRECORDED_SENTINEL,
                              digest_name)


def guarded(columns: dict, n: int) -> TensorDict:
    """What the guard hands the data plane: each field, and its digest column."""
    td = TensorDict({f: torch.randn(n) for f in columns}, batch_size=[n])
    td.update({digest_name(f): torch.tensor(d, dtype=torch.int64) for f, d in columns.items()})
    return td


def merged(current: list[dict], rows: list[dict]) -> list[dict]:
    """TransferQueue's merge of a put's tags into the rows' tags (dict.update per row)."""
    return [{**c, **r} for c, r in zip(current, rows)]


def test_one_entry_per_row_holds_every_field_in_order():
    bare, rows = digests_to_tags(guarded({"a": [1, 2], "b": [3, 2**32 - 1]}, 2), None, 2)
    assert sorted(bare.keys()) == ["a", "b"]
    assert [list(r) for r in rows] == [[DIGEST_PREFIX + "a,b"]] * 2
    assert np.frombuffer(rows[1][DIGEST_PREFIX + "a,b"], "<i8").tolist() == [2, 2**32 - 1]
    back = digest_columns(bare, rows)
    assert back[digest_name("a")].tolist() == [1, 2]
    assert back[digest_name("b")].tolist() == [3, 2**32 - 1]


def test_user_tags_ride_along_and_are_stripped_alone():
    user = [{"u": 0}, {"u": 1, "src": "x"}]
    _, rows = digests_to_tags(guarded({"a": [5, 6]}, 2), user, 2)
    assert [r["u"] for r in rows] == [0, 1] and rows[1]["src"] == "x"
    assert strip_digest_tags(rows) == user
    assert [without_digest_tags(r) for r in rows] == user
    plain = [{"u": 2}]
    assert strip_digest_tags(plain) is plain and without_digest_tags(plain[0]) is plain[0]


def test_a_rewrite_of_some_fields_rewrites_them_inside_the_wider_entry():
    _, first = digests_to_tags(guarded({"a": [1, 2], "b": [3, 4]}, 2), None, 2)
    _, second = digests_to_tags(guarded({"b": [40, 41]}, 2), None, 2, current=first)
    wide = DIGEST_PREFIX + "a,b"
    assert np.frombuffer(second[0][wide], "<i8").tolist() == [1, 40]
    assert np.frombuffer(second[1][wide], "<i8").tolist() == [2, 41]
    rows = merged(first, second)
    back = digest_columns(TensorDict({"a": torch.zeros(2), "b": torch.zeros(2)}, [2]), rows)
    assert back[digest_name("b")].tolist() == [40, 41]  # never the stale 3, 4
    assert back[digest_name("a")].tolist() == [1, 2]
    # A rewrite of fields no entry holds leaves every other entry alone.
    _, third = digests_to_tags(guarded({"c": [7, 8]}, 2), None, 2, current=rows)
    assert [list(r) for r in third] == [[DIGEST_PREFIX + "c"]] * 2


def test_a_delta_write_adds_an_entry_and_a_subset_read_finds_each_field():
    _, first = digests_to_tags(guarded({"a": [1, 2]}, 2), None, 2)
    _, delta = digests_to_tags(guarded({"b": [3, 4]}, 2), None, 2, current=first)
    rows = merged(first, delta)
    back = digest_columns(TensorDict({"b": torch.zeros(2)}, [2]), rows)
    assert list(back.keys()) == ["b", digest_name("b")]
    assert back[digest_name("b")].tolist() == [3, 4]


def test_rows_without_an_entry_or_with_a_damaged_one_are_unverified():
    _, rows = digests_to_tags(guarded({"a": [1, 2, 3]}, 3), None, 3)
    rows[1] = {"u": 1}  # written without the guard
    rows[2] = {DIGEST_PREFIX + "a": b"\x00" * 5}  # not 8 bytes per field
    back = digest_columns(TensorDict({"a": torch.zeros(3), "z": torch.zeros(3)}, [3]), rows)
    assert back[digest_name("a")].tolist() == [1, UNRECORDED_SENTINEL, UNRECORDED_SENTINEL]
    assert digest_name("z") not in back.keys()  # no row has one: the guard counts it
    none = digest_columns(TensorDict({"a": torch.zeros(2)}, [2]), [{}, {"u": 1}])
    assert list(none.keys()) == ["a"]


def test_field_names_with_commas_and_dots_round_trip():
    fields = {"x,y": [9, 8], "p.q": [7, 6]}
    bare, rows = digests_to_tags(guarded(fields, 2), None, 2)
    back = digest_columns(bare, rows)
    for f, d in fields.items():
        assert back[digest_name(f)].tolist() == d


def test_sentinel_columns_and_a_data_parser():
    td = guarded({"a": [1, 2]}, 2)
    td[digest_name("t")] = torch.full((2,), NONTENSOR_SENTINEL, dtype=torch.int64)
    _, rows = digests_to_tags(td, None, 2)
    assert [list(r) for r in rows] == [[DIGEST_PREFIX + "a"]] * 2  # non-tensor: no digest
    _, first = digests_to_tags(guarded({"a": [1, 2], "b": [3, 4]}, 2), None, 2)
    _, parsed = digests_to_tags(guarded({"a": [1, 2]}, 2), None, 2, unrecorded=True,
                                current=first)
    back = digest_columns(TensorDict({"a": torch.zeros(2), "b": torch.zeros(2)}, [2]),
                          merged(first, parsed))
    assert back[digest_name("a")].tolist() == [UNRECORDED_SENTINEL] * 2
    assert back[digest_name("b")].tolist() == [3, 4]


def test_a_tag_list_of_the_wrong_length_is_left_for_transferqueue_to_refuse():
    bare, tags = digests_to_tags(guarded({"a": [1, 2]}, 2), [{"u": 0}], 2)
    assert tags == [{"u": 0}] and digest_name("a") not in bare.keys()


def test_in_place_stripping_drops_only_the_reserved_entries():
    _, rows = digests_to_tags(guarded({"a": [1, 2]}, 2), [{"u": 0}, {"u": 1}], 2)
    same = strip_digest_tags(rows, in_place=True)
    assert same is rows and rows == [{"u": 0}, {"u": 1}]
