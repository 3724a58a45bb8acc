"""What the row-age tests share: Telemetries made and shut down per test, and the checks of a
live backend's read (tests/adapters/*/test_*rowage*.py)."""
from __future__ import annotations

import contextlib

import pytest

import dpobs_otel as dpobs
from helpers import value

AGE = "dpobs_client_row_age_seconds"
BYTES = "dpobs_client_transferred_bytes_total"


@contextlib.contextmanager
def telemetries():
    """make(row_age=True, guard=False) -> a fresh Telemetry; all shut down at the end."""
    made = []

    def make(row_age=True, guard=False):
        t = dpobs.start(role="test", rank=len(made), port=0, row_age=row_age,
                        verify_tensor_hash=guard)
        made.append(t)
        return t
    try:
        yield make
    finally:
        for t in made:
            t.shutdown()


def check_live_reads(m, got, full, guard: bool) -> None:
    """The live backends' case: rows a0, a1 read 5 s after their put, a2 1 s after its
    restamping delta write, b0, b1 never stamped; `got` selected tok, `full` read a0, a1."""
    assert list(got.keys()) == ["tok"] and sorted(full.keys()) == ["adv", "tok"]
    assert value(m, AGE + "_count", op="get") == 5
    assert value(m, AGE + "_sum", op="get") == pytest.approx(4 * 5 + 1)
    assert value(m, AGE + "_bucket", op="get", le="1.0") == 1
    assert value(m, AGE + "_bucket", op="get", le="5.0") == 5
    assert value(m, "dpobs_client_rows_unstamped_total", op="get", reason="no_stamp") == 2
    nbytes = got["tok"].nbytes + full["tok"].nbytes + full["adv"].nbytes  # the caller's alone
    assert value(m, BYTES, op="get", direction="read") == nbytes
    if guard:
        assert value(m, "dpobs_guard_rows_checked_total", field="tok") == 7
        assert value(m, "dpobs_guard_rows_mismatched_total", field="tok") == 0
