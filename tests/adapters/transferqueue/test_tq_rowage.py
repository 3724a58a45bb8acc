"""Row age's stamp on TransferQueue: one more word in the guard's tag entry (or an entry of its
own with the guard off), restamped by a delta write, kept through a data_parser, read back
as the stamp column, never in the caller's tags. No live TransferQueue here: the tags are
merged as TransferQueue merges them (dict.update per row)."""
from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from dpobs_otel.adapters.transferqueue.digests import (digest_columns, digests_to_tags,
                                                      strip_digest_tags)
from dpobs_otel.guard import DIGEST_PREFIX, UNRECORDED_SENTINEL, digest_name
from dpobs_otel.rowage import STAMP


def stamped(fields: dict, stamp: int, n: int, digests: dict | None = None) -> TensorDict:
    """What the core hands the data plane: fields, the guard's digests if on, the stamp."""
    td = TensorDict({f: torch.randn(n) for f in fields}, batch_size=[n])
    for f, d in (digests or {}).items():
        td.set(digest_name(f), torch.tensor(d, dtype=torch.int64))
    td.set(STAMP, torch.full((n,), stamp, dtype=torch.int64))
    return td


def merged(current, rows):
    return [{**c, **r} for c, r in zip(current, rows)]


def words(blob) -> list[int]:
    return np.frombuffer(blob, "<i8").tolist()


def test_guard_on_the_stamp_is_one_word_more_in_the_same_entry():
    bare, rows = digests_to_tags(stamped(["a"], 77, 2, {"a": [1, 2]}), None, 2)
    assert list(bare.keys()) == ["a"]
    entry = DIGEST_PREFIX + "a,%stamp"
    assert [list(r) for r in rows] == [[entry]] * 2
    assert words(rows[1][entry]) == [2, 77]
    back = digest_columns(bare, rows)
    assert back[STAMP].tolist() == [77, 77] and back[digest_name("a")].tolist() == [1, 2]


def test_guard_off_the_stamp_has_an_entry_of_its_own():
    bare, rows = digests_to_tags(stamped(["a", "b"], 5, 3), [{"u": 1}] * 3, 3)
    assert sorted(bare.keys()) == ["a", "b"]
    assert [sorted(r) for r in rows] == [[DIGEST_PREFIX + "%stamp", "u"]] * 3
    assert digest_columns(bare, rows)[STAMP].tolist() == [5, 5, 5]
    assert strip_digest_tags(rows) == [{"u": 1}] * 3  # the caller's tags, alone


def test_a_delta_write_restamps_the_rows_older_entry():
    _, first = digests_to_tags(stamped(["a"], 100, 2, {"a": [1, 2]}), None, 2)
    _, second = digests_to_tags(stamped(["b"], 250, 2, {"b": [3, 4]}), None, 2, current=first)
    rows = merged(first, second)
    assert words(rows[0][DIGEST_PREFIX + "a,%stamp"]) == [1, 250]  # restamped in place
    only_a = digest_columns(TensorDict({"a": torch.zeros(2)}, [2]), rows)
    assert only_a[STAMP].tolist() == [250, 250]
    assert only_a[digest_name("a")].tolist() == [1, 2]  # the digest itself untouched


def test_a_data_parser_keeps_the_write_time():
    _, rows = digests_to_tags(stamped(["a"], 42, 2, {"a": [1, 2]}), None, 2, unrecorded=True)
    assert words(rows[0][DIGEST_PREFIX + "a,%stamp"]) == [UNRECORDED_SENTINEL, 42]


def test_rows_without_a_stamp_read_back_as_unstamped():
    _, rows = digests_to_tags(stamped(["a"], 9, 2), None, 2)
    back = digest_columns(TensorDict({"a": torch.zeros(3)}, [3]), rows + [{}])
    assert back[STAMP].tolist() == [9, 9, UNRECORDED_SENTINEL]
    nothing = digest_columns(TensorDict({"a": torch.zeros(1)}, [1]), [{"u": 0}])
    assert STAMP not in nothing.keys()
