"""The proof out of band (the default) in one process: the sender's stream is exactly the
program's items, the fingerprints go through the job's store (a one-rank group's c10d store
here; Ray's internal KV in tests/weights/test_live_ray_board.py; every corruption caught
through it: test_sync.py); the receiver's sync is recorded before its check, which never blocks it; the store's
absence, failure or slowness counts the tensors unchecked with a reason, never as a mismatch
or an error of the program; and a sender keeps only its last versions in the store."""
from __future__ import annotations

import pytest
import torch
from helpers.weights import model

from dpobs_otel import names
from dpobs_otel.weights import manifest

NONE_MISMATCHED = dict.fromkeys(names.WEIGHT_MISMATCH_REASONS, 0)


def _sides(proving):
    return proving("trainer", in_band=False), proving("rollout", in_band=False)


def _push(s, r, w, version=1, tamper=None):
    """One sync through both wrappers; what the sender's program handed its transport, and
    what the receiver's program got, once both sides' proofs are done."""
    sent = list(s.weights.sent(iter(w.items()), version=version))
    items = sent if tamper is None else tamper(list(sent))
    got = list(r.weights.received(iter(items), version=version))
    assert s.weights.settle(30) and r.weights.settle(30)
    return sent, got


def _stats(tel):
    return tel.weights.meter.stats


def test_the_stream_is_the_programs_items_and_every_tensor_is_checked(proving, store):
    s, r = _sides(proving)
    w = model()
    sent, got = _push(s, r, w, version=3)
    assert [(n, id(t)) for n, t in sent] == [(n, id(t)) for n, t in w.items()]
    assert [(n, id(t)) for n, t in got] == [(n, id(t)) for n, t in w.items()]
    st = _stats(r)
    assert st.checked == len(w) and st.mismatched == NONE_MISMATCHED
    assert not any(st.unchecked.values())
    assert store.check([f"dpobs/weights/{s.settings.job}/3/1"])  # where it travelled


def test_the_receivers_sync_ends_before_its_check_which_counts_once_the_sender_posts(
        proving, store):
    s, r = _sides(proving)
    w = model()
    list(r.weights.received(iter(w.items()), version=5))  # the sender has not posted yet
    st = _stats(r)
    assert st.syncs["receive"] == 1 and st.checked == 0  # recorded, the check still waiting
    list(s.weights.sent(iter(w.items()), version=5))
    assert s.weights.settle(30) and r.weights.settle(30)
    assert st.checked == len(w) and st.mismatched == NONE_MISMATCHED


def test_without_a_store_the_tensors_are_unchecked_and_nothing_else(proving):
    s, r = _sides(proving)
    w = model()
    sent, got = _push(s, r, w)
    assert [n for n, _ in sent] == [n for n, _ in got] == list(w)
    st = _stats(r)
    assert st.unchecked["no_store"] == len(w) and st.checked == 0
    assert st.mismatched == NONE_MISMATCHED
    assert not r.stats.instr_errors.get(names.COMPONENT_WEIGHTS)


def test_a_sender_that_never_posts_leaves_the_receiver_unchecked_in_bounded_time(
        proving, store):
    s, r = proving("trainer", guard=False, in_band=False), proving("rollout", in_band=False)
    r.weights.carriage.wait_s = 0.2  # the sender's guard is off: nothing will come
    _push(s, r, model())
    st = _stats(r)
    assert st.unchecked["no_manifest"] == len(model()) and st.checked == 0
    assert st.mismatched == NONE_MISMATCHED


def test_a_post_later_than_the_wait_is_unchecked_not_a_mismatch(proving, store):
    s, r = _sides(proving)
    r.weights.carriage.wait_s = 0.05  # a slow store, or a slow sender
    w = model()
    list(r.weights.received(iter(list(w.items())[1:]), version=1))  # one tensor lost
    assert r.weights.settle(30)
    list(s.weights.sent(iter(w.items()), version=1))
    assert s.weights.settle(30)
    st = _stats(r)
    assert st.unchecked["no_manifest"] == len(w) - 1 and st.mismatched == NONE_MISMATCHED


def test_a_store_that_is_down_is_unchecked_with_its_reason(proving, monkeypatch):
    import torch.distributed as dist
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    server = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 1, False)
    dist.init_process_group("gloo", store=client, rank=0, world_size=1)
    try:
        s, r = _sides(proving)
        del server  # the store's server is gone: every call of its clients fails
        w = model()
        _push(s, r, w)
        st = _stats(r)
        assert st.unchecked["store_error"] == len(w) and st.checked == 0
        assert st.mismatched == NONE_MISMATCHED
        assert s.stats.instr_errors[names.COMPONENT_WEIGHTS] == 1  # the sender's post
    finally:
        dist.destroy_process_group()


def test_a_store_that_refuses_the_post_leaves_receivers_unchecked(proving, store, monkeypatch):
    def full(self, version, data, sender=""):
        raise RuntimeError("the store is full")
    monkeypatch.setattr(manifest.C10dBoard, "post", full)
    s, r = _sides(proving)
    r.weights.carriage.wait_s = 0.2
    w = model()
    sent, got = _push(s, r, w)
    assert [n for n, _ in got] == list(w)
    assert _stats(r).unchecked["no_manifest"] == len(w)
    assert _stats(r).mismatched == NONE_MISMATCHED


def test_a_sender_keeps_only_its_last_versions_in_the_store(proving, store):
    s, _ = _sides(proving)
    for v in range(1, 10):
        list(s.weights.sent(iter(model(v).items()), version=v))
    assert s.weights.settle(30)
    job = s.settings.job
    kept = [v for v in range(1, 10) if store.check([f"dpobs/weights/{job}/{v}/n"])]
    assert kept == list(range(10 - manifest.KEEP, 10))


def test_a_receiver_takes_its_own_senders_manifest_and_its_latest_post():
    a = manifest.dumps(1, {"x": 1, "y": 2}, "A")
    b = manifest.dumps(1, {"z": 3}, "B")
    again = manifest.dumps(1, {"x": 5, "y": 2}, "A")
    assert manifest.expected_of([a, b], {"x": 1}) == {"x": 1, "y": 2}
    assert manifest.expected_of([a, b, again], {"x": 5}) == {"x": 5, "y": 2}
    assert manifest.expected_of([b], {"x": 1}) is None  # not its sender's: keep waiting
    assert manifest.expected_of([a, b], {}) == {"x": 1, "y": 2, "z": 3}
