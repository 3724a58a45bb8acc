"""Writer and reader in different OS processes: the digests travel with the rows through the
shared store, so the reader verifies the writer's rows, and catches a corruption that a third
process injected in between (it rewrites one element and keeps the writer's digest column)."""
from __future__ import annotations

import multiprocessing
import os

import pytest
from helpers.rollout import N, PART
from helpers.rollout import payload as _payload


def _ids():
    return [f"uid-{i}" for i in range(N)]


def _guard_counts(tel) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in tel.registry.collect():
        for s in family.samples:
            if s.name.startswith("dpobs_guard_") and s.name.endswith("_total"):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def _writer(address) -> dict:
    import dpobs_otel as dpobs
    from dpobs_otel.stores.memory import connect_store

    tel = dpobs.start(role="rollout", rank=0, port=0, verify_tensor_hash=True)
    try:
        client = tel.instrument(connect_store(address))
        client.register_partition(PART)
        client.put_samples(_ids(), PART, _payload())
        return _guard_counts(tel)
    finally:
        tel.shutdown()


def _tamper(address) -> None:
    """A third process, around any guard: flip one element of one row, keep its digest."""
    import torch

    from dpobs_otel.stores.memory import connect_store

    raw = connect_store(address)
    row = raw.get_samples(["uid-17"], PART)  # every column, the writer's digests included
    logp = row["logprobs"].clone()
    logp.view(torch.int16)[0, 3] ^= 1
    row.set("logprobs", logp)
    raw.put_samples(["uid-17"], PART, row)


def _reader(address) -> dict:
    import logging

    import dpobs_otel as dpobs
    from dpobs_otel.stores.memory import connect_store

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    handler = Keep(level=logging.ERROR)
    logging.getLogger("dpobs_otel.guard").addHandler(handler)
    tel = dpobs.start(role="trainer", rank=1, port=0, verify_tensor_hash=True)
    try:
        client = tel.instrument(connect_store(address))
        ids = _ids()[::-1]
        out = client.get_samples(ids[: N // 2], PART)  # two shards, reversed order
        out2 = client.get_samples(ids[N // 2:], PART, ["input_ids", "logprobs"])
        keys = sorted(out.keys()) + sorted(out2.keys())
        return {"counts": _guard_counts(tel), "lines": lines, "keys": keys}
    finally:
        logging.getLogger("dpobs_otel.guard").removeHandler(handler)
        tel.shutdown()


@pytest.fixture
def shared_store():
    from dpobs_otel.stores.memory import serve_store

    manager, address = serve_store()
    try:
        yield address
    finally:
        manager.shutdown()


@pytest.mark.slow
def test_reader_in_another_process_verifies_and_catches_tampering(shared_store):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as writer, ctx.Pool(1) as reader, ctx.Pool(1) as tamperer:
        writer_pid, reader_pid, tamper_pid = (p.apply(os.getpid) for p in (writer, reader, tamperer))
        assert len({os.getpid(), writer_pid, reader_pid, tamper_pid}) == 4

        written = writer.apply(_writer, (shared_store,))
        assert written["dpobs_guard_rows_recorded_total"] == 4 * N

        clean = reader.apply(_reader, (shared_store,))
        c = clean["counts"]
        # first shard: all four tensor fields; second shard: the two selected
        assert c["dpobs_guard_rows_checked_total"] == 4 * (N // 2) + 2 * (N // 2)
        assert c.get("dpobs_guard_rows_mismatched_total", 0) == 0
        assert c.get("dpobs_guard_rows_unverified_total", 0) == 0
        assert not any(k.startswith("__dpobs") for k in clean["keys"])
        assert clean["lines"] == []

        tamperer.apply(_tamper, (shared_store,))
        caught = reader.apply(_reader, (shared_store,))
    c = caught["counts"]
    assert c["dpobs_guard_rows_mismatched_total"] == 1
    assert c.get("dpobs_guard_rows_unverified_total", 0) == 0
    # uid-17 sits in the second (reversed) shard at row N-1-17-N//2
    assert caught["lines"] == [
        "dpobs wire guard: fingerprint mismatch: field=logprobs sample_id=uid-17 "
        f"row={N - 1 - 17 - N // 2} row_len=16 partition={PART}"]
