"""Mooncake measured through dpobs against a real master on loopback: exact counts and bytes
on /metrics through the protocol and through instrument_store, codes as errors, the wire
guard and a shared partition across processes, and the launcher's sockets. Skipped only when
the mooncake wheel is not installed (helpers.mooncake)."""
from __future__ import annotations

import json
import os

import msgpack
import pytest
import torch
from helpers import scrape, value
from tensordict import NonTensorData, TensorDict

from helpers.mooncake import (BYTES, ERRORS, KEYS, LOOPBACK, OPS, Blinking, MooncakeDataPlane,
                              N, batch_n, fan_in, listening, open_plane, read_rows, tamper_row,
                              workers, write_rows)

from dpobs_otel.adapters.mooncake import MooncakeError, instrument_store


# -- measured through dpobs -----------------------------------------------------------
def test_protocol_workload_counts_and_bytes_are_exact(tel, dp):
    client = tel.instrument(dp)
    truth = {"put": 0, "get": 0, "keys_get": 0}
    ids_all = []
    for step in range(5):
        n = 3 + step
        ids = [f"s{step}-{i}" for i in range(n)]
        td = batch_n(n)
        td["meta"] = NonTensorData({"step": step})
        client.put_samples(ids, "train", td)
        truth["put"] += n * 3 * 4 + sum(range(1, n + 1)) * 8 + len(msgpack.packb({"step": step}))
        got = client.get_samples(ids[:2], "train", ["tok", "x"])
        truth["get"] += got["tok"].values().nbytes + got["x"].nbytes
        truth["keys_get"] += 2
        ids_all += ids
    client.clear_samples(ids_all[:4], "train")
    client.clear_samples(None, "train")
    s = scrape(tel)
    assert value(s, OPS, op="put") == 5 and value(s, OPS, op="get") == 5
    assert value(s, OPS, op="clear") == 2
    assert value(s, BYTES, op="put", direction="write") == truth["put"]
    assert value(s, BYTES, op="get", direction="read") == truth["get"]
    assert value(s, KEYS, op="put") == len(ids_all) and value(s, KEYS, op="get") == 10
    assert value(s, KEYS, op="clear") == len(ids_all)
    assert value(s, "dpobs_client_outstanding_keys") == 0
    with pytest.raises(KeyError):
        client.get_samples(["ghost"], "train")
    assert value(scrape(tel), ERRORS, op="get", error_type="KeyError") == 1


def test_a_code_the_plane_raises_is_counted_with_the_code(tel, store):
    class Refusing(Blinking):
        def upsert_batch(self, keys, values):
            return -800  # TRANSFER_FAIL

    client = tel.instrument(MooncakeDataPlane(Refusing(store, None), namespace="refusing"))
    with pytest.raises(MooncakeError) as info:
        client.put_samples(["a"], "p", TensorDict({"x": torch.ones(1)}, [1]))
    assert info.value.code == -800 and type(info.value).__name__ == "MooncakeError-800"
    assert value(scrape(tel), ERRORS, op="put", error_type="MooncakeError-800") == 1


def test_raw_store_ops_exact_bytes_codes_and_misses(tel, store):
    raw = instrument_store(tel, store)
    a, b = torch.arange(12, dtype=torch.float32), torch.ones(5, 7, dtype=torch.bfloat16)
    keys = ["raw-a", "raw-b", "raw-c"]
    assert raw.put_tensor(keys[0], a) == 0
    assert raw.batch_put_tensor(keys[1:], [b, torch.zeros(3, dtype=torch.int64)]) == [0, 0]
    assert raw.put("raw-bytes", b"hello world") == 0
    written = a.nbytes + b.nbytes + 24 + 11
    stored = sum(store.get_size(k) for k in keys)  # Mooncake's own sizes: with headers
    assert stored > a.nbytes + b.nbytes + 24  # so they are not what the series count
    got = raw.batch_get_tensor(keys[:2] + ["raw-missing"])
    assert got[2] is None and torch.equal(got[0], a)
    assert raw.get("raw-bytes") == b"hello world"
    assert raw.get_tensor("raw-missing") is None
    assert raw.remove("raw-a") == -706  # read (and sized) just now: leased
    assert raw.remove("raw-never") == -704
    s = scrape(tel)
    assert value(s, OPS, op="put") == 3 and value(s, KEYS, op="put") == 4
    assert value(s, BYTES, op="put", direction="write") == written
    assert value(s, BYTES, op="get", direction="read") == a.nbytes + b.nbytes + 11
    assert value(s, "dpobs_client_rows_missing_total", op="get") == 2
    assert value(s, ERRORS, op="clear", error_type="MooncakeError-706") == 1
    assert value(s, ERRORS, op="clear", error_type="MooncakeError-704") == 1
    assert value(s, OPS, op="clear") == 2
    assert value(s, "dpobs_client_outstanding_keys") == 4  # raw-a is still there
    # A mixed batch: the removed keys and their calls count, the leased one is an error.
    codes = raw.batch_remove(["raw-a", "raw-bytes"])
    assert codes[1] in (0, -706)
    s = scrape(tel)
    assert value(s, OPS, op="clear") == 3
    assert value(s, ERRORS, op="clear", error_type="MooncakeError-706") == 1 + (-706 in codes)


def test_raw_store_exceptions_propagate_unchanged_and_codes_are_errors(tel, store):
    raw = instrument_store(tel, store)
    with pytest.raises(TypeError) as info:
        raw.put_tensor(123, torch.ones(1))  # pybind refuses the key: a real exception
    with pytest.raises(TypeError) as bare:
        store.put_tensor(123, torch.ones(1))
    assert str(info.value) == str(bare.value)
    assert raw.put_tensor("raw-x", "not a tensor") == -600  # Mooncake's code, unchanged
    s = scrape(tel)
    assert value(s, ERRORS, op="put", error_type="TypeError") == 1
    assert value(s, ERRORS, op="put", error_type="MooncakeError-600") == 1
    assert value(s, OPS, op="put") == 2
    assert value(s, BYTES, op="put", direction="write") == 0
    assert value(s, "dpobs_client_outstanding_keys") == 0
    assert raw.get_hostname() == store.get_hostname()  # unmeasured methods pass through


def test_raw_store_occupancy_returns_to_zero(tel, store):
    raw = instrument_store(tel, store)
    raw.batch_put_tensor(["occ-1", "occ-2"], [torch.ones(4), torch.ones(8)])
    raw.upsert("occ-3", b"xyz")
    assert value(scrape(tel), "dpobs_client_outstanding_size_bytes") == 51
    assert raw.remove_by_regex("^occ-") == 3  # nothing read them: no lease
    s = scrape(tel)
    assert value(s, "dpobs_client_outstanding_keys") == 0
    assert value(s, KEYS, op="clear") == 3



@pytest.mark.slow
def test_guard_across_processes_catches_a_row_rewritten_by_a_bare_client(master):
    addr = (master.rpc_address, master.metadata_url)
    with workers(3) as (writer, reader, tamperer):
        written = writer.apply(write_rows, (addr,))
        assert written["recorded"] == 4 * N  # the four tensor fields
        clean = reader.apply(read_rows, (addr,))
        assert clean["pid"] != os.getpid()
        c = clean["counts"]
        assert c["checked"] == 4 * N
        assert c["mismatched"] == 0
        assert c["unverified"] == 0
        assert clean["keys"] == ["advantages", "input_ids", "logprobs", "mask", "prompt"]  # digests stripped
        tamperer.apply(tamper_row, (addr,))
        caught = reader.apply(read_rows, (addr,))["counts"]
    assert caught["mismatched"] == 1
    assert caught["checked"] == 4 * N



@pytest.mark.slow
def test_writers_in_several_processes_share_a_partition_listing(master, store):
    """No key is written by two processes, so concurrent writers lose nothing, and a
    listing taken meanwhile never misses an id that the listings before and after have."""
    addr = (master.rpc_address, master.metadata_url)
    reader = MooncakeDataPlane(store, namespace="guard", lease_s=master.lease_s)
    reader.register_partition("fan-in")
    with workers(3) as pools:
        for p in pools:  # set the clients up one at a time, then write all at once
            p.apply(open_plane, (addr,))
        jobs = [p.apply_async(fan_in, (addr, w, 40)) for w, p in enumerate(pools)]
        listings = []
        while not all(j.ready() for j in jobs):
            listings.append(set(reader.list_sample_ids("fan-in")))
        expected = [sid for j in jobs for sid in j.get(timeout=60)]
        final = reader.list_sample_ids("fan-in")
    reader.close()
    assert sorted(final) == sorted(expected) and len(final) == 3 * 40 * 8 - 3 * 13 * 4
    flicker = set()
    for before, now, after in zip(listings, listings[1:], listings[2:]):
        flicker |= (before & after) - now
    assert len(listings) > 3 and not flicker



def test_master_listens_on_loopback_only(master):
    """Every socket the launcher's processes listen on (the master's RPC and admin servers,
    the metadata server, anything else they open) is bound to loopback: read from the
    kernel's socket tables, not from our flags."""
    seen = listening(master.pids)
    assert len(master.pids) == 2
    assert {master.rpc_port, master.metadata_port, master.metrics_port} <= set(seen)
    assert set(seen.values()) <= LOOPBACK, json.dumps(seen)

