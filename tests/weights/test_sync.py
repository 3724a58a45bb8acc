"""tel.weights in one process: exact bytes and tensors per side, the manifest in and out,
every kind of corruption caught in band and through the store (and none on clean syncs),
the step's accounting, the block form, errors of the user's stream and of dpobs itself,
and the off switch."""
from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from helpers.weights import model, payload_bytes

import dpobs_otel as dpobs
from dpobs_otel import names
from dpobs_otel.facade import DisabledTelemetry
from dpobs_otel.weights import MANIFEST_NAME


def _push(sender, receiver, weights, version=1, tamper=None):
    """One sync through both wrappers; tamper(items) edits what travels."""
    items = list(sender.weights.sent(iter(weights.items()), version=version))
    if tamper is not None:
        items = tamper(items)
    return dict(receiver.weights.received(iter(items), version=version))


def test_a_clean_sync_counts_exact_bytes_and_checks_every_tensor(proving):
    s, r = proving("trainer"), proving("rollout")
    w = model()
    got = _push(s, r, w, version=4)
    assert MANIFEST_NAME not in got and list(got) == list(w)
    nbytes = payload_bytes(w.values())
    for tel, side in ((s, "send"), (r, "receive")):
        st = tel.weights.meter.stats
        assert (st.syncs[side], st.bytes[side], st.tensors[side]) == (1, nbytes, len(w))
        assert st.version == {side: 4}
    rs = r.weights.meter.stats
    assert rs.checked == len(w) and not any(rs.mismatched.values())


def _flip(items):
    t = items[1][1].clone()
    t.view(-1)[3] = -t.view(-1)[3] + 1
    return [items[0], (items[1][0], t), *items[2:]]


def _swap_rows(items):
    t = items[0][1].clone()
    t[[0, 1]] = t[[1, 0]]
    return [(items[0][0], t), *items[1:]]


def _upcast(items):
    return [(items[0][0], items[0][1].float()), *items[1:]]


def _drop(items):
    return items[1:]


def _extra(items):
    return [*items[:-1], ("rogue.bias", torch.zeros(3)), items[-1]]


@pytest.mark.parametrize("in_band", [True, False], ids=["in band", "through the store"])
@pytest.mark.parametrize("tamper, reason, n", [
    (_flip, "value", 1), (_swap_rows, "value", 1), (_upcast, "value", 1),
    (_drop, "missing", 1), (_extra, "unexpected", 1)],
    ids=["flipped element", "swapped rows", "dtype change", "missing", "extra"])
def test_each_corruption_is_caught_by_its_reason(proving, request, tamper, reason, n, in_band):
    if not in_band:
        request.getfixturevalue("store")  # the default carriage: a one-rank group's store
    s, r = proving("trainer", in_band=in_band), proving("rollout", in_band=in_band)
    w = model()
    _push(s, r, w, tamper=tamper)
    assert s.weights.settle(30) and r.weights.settle(30)
    mism = r.weights.meter.stats.mismatched
    assert mism == {**{k: 0 for k in names.WEIGHT_MISMATCH_REASONS}, reason: n}
    assert r.weights.meter.stats.checked == len(w) + (reason == "unexpected")


def test_a_skipped_sync_leaves_the_receiver_a_version_behind(proving):
    s, r = proving("trainer"), proving("rollout")
    _push(s, r, model(1), version=1)
    list(s.weights.sent(iter(model(2).items()), version=2))  # nobody took version 2
    assert s.weights.meter.stats.version["send"] == 2
    assert r.weights.meter.stats.version["receive"] == 1


def test_async_streams_pass_through_and_are_counted(proving):
    s, r = proving("trainer"), proving("rollout")
    w = model()

    async def source():
        for item in w.items():
            await asyncio.sleep(0)
            yield item

    async def main():
        sent = [x async for x in s.weights.sent(source(), version=2)]

        async def again():
            for x in sent:
                yield x
        return [x async for x in r.weights.received(again(), version=2)]

    got = asyncio.run(main())
    assert [n for n, _ in got] == list(w)
    assert r.weights.meter.stats.checked == len(w)
    assert r.weights.meter.stats.bytes["receive"] == payload_bytes(w.values())


def test_the_sync_is_the_steps_own_time_not_the_data_planes(proving):
    s = proving("trainer")
    with s.step():
        list(s.weights.sent(iter(model().items()), version=1))
    st = s.weights.meter.stats
    assert st.step_seconds > 0 and st.step_seconds == st.seconds["send"]
    busy, exposed = s.critical.totals()
    assert busy == 0 and exposed == 0
    list(s.weights.sent(iter(model().items()), version=2))  # outside any step
    assert st.step_seconds < st.seconds["send"]
    m = s.step_metrics()
    assert m["dpobs/weights/syncs"] == 2 and m["dpobs/weights/tensors"] == 2 * len(model())


def _one_rank_group(monkeypatch, tmp_path):
    import torch.distributed as dist
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # gloo's sockets on loopback only
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    return dist


def test_a_block_counts_notes_and_torch_distributed_calls_once_each(proving, tmp_path,
                                                                     monkeypatch):
    s = proving("trainer")
    dist = _one_rank_group(monkeypatch, tmp_path)
    try:
        w = model()
        with s.weights.sync(version=3, side="send") as sync:
            for name, t in w.items():
                sync.note(name, t)
                dist.broadcast(t, src=0)  # the same tensor: counted once
            extra = torch.ones(10)
            dist.broadcast(extra, src=0)  # not noted: counted by the hook
            name, manifest = sync.manifest()
            assert name == MANIFEST_NAME and manifest.dtype == torch.uint8
        dist.broadcast(torch.ones(5), src=0)  # after the block: not counted
        st = s.weights.meter.stats
        assert st.tensors["send"] == len(w) + 1
        assert st.bytes["send"] == payload_bytes(w.values()) + 40
    finally:
        dist.destroy_process_group()


def test_a_block_on_another_thread_does_not_count_this_threads_calls(proving, tmp_path,
                                                                      monkeypatch):
    s = proving("trainer")
    dist = _one_rank_group(monkeypatch, tmp_path)
    try:
        inside, go = threading.Event(), threading.Event()

        def other():
            with s.weights.sync(version=1, side="send"):
                inside.set()
                go.wait(10)
        th = threading.Thread(target=other)
        th.start()
        inside.wait(10)
        dist.broadcast(torch.ones(8), src=0)
        go.set()
        th.join()
        assert s.weights.meter.stats.tensors["send"] == 0
    finally:
        dist.destroy_process_group()


def test_the_users_stream_error_propagates_and_the_sync_still_ends(proving):
    s = proving("trainer")

    def broken():
        yield "a", torch.ones(4)
        raise ConnectionError("transport died")

    with pytest.raises(ConnectionError, match="transport died"):
        list(s.weights.sent(broken(), version=1))
    st = s.weights.meter.stats
    assert st.syncs["send"] == 1 and st.tensors["send"] == 1


def test_dpobs_own_failures_are_swallowed_and_counted(proving, monkeypatch):
    s, r = proving("trainer"), proving("rollout")
    from dpobs_otel.weights import sync as sync_mod

    def boom(name, tensor):
        raise RuntimeError("fingerprint broke")
    monkeypatch.setattr(sync_mod, "fingerprint", boom)
    w = model()
    got = _push(s, r, w)
    assert list(got) == list(w)  # the user's weights went through untouched
    errors = s.stats.instr_errors.get(names.COMPONENT_WEIGHTS, 0)
    assert errors == len(w)


def test_items_that_are_not_pairs_pass_through_uncounted(proving):
    s = proving("trainer")
    items = [("a", torch.ones(2)), "not a pair", ("b", torch.ones(3))]
    out = list(s.weights.sent(iter(items), version=1))
    assert out[:3] == items
    assert s.weights.meter.stats.tensors["send"] == 2


def test_without_the_guard_nothing_extra_travels(proving):
    s, r = proving("trainer", guard=False), proving("rollout", guard=False)
    w = model()
    items = list(s.weights.sent(iter(w.items()), version=1))
    assert [n for n, _ in items] == list(w)
    _push(s, r, w)
    assert r.weights.meter.stats.checked == 0
    assert r.weights.meter.stats.bytes["receive"] == payload_bytes(w.values())


@pytest.mark.parametrize("bad", [dict(version=-1, side="send"), dict(version=1.5, side="send"),
                                 dict(version=1, side="both")])
def test_bad_arguments_get_a_clear_error(proving, bad):
    s = proving("trainer")
    with pytest.raises(ValueError, match="version|side"):
        s.weights.sync(**bad)


def test_off_the_same_surface_does_nothing(monkeypatch):
    monkeypatch.setenv("DPOBS_DISABLED", "1")
    tel = dpobs.start(role="trainer", rank=0)
    assert isinstance(tel, DisabledTelemetry)
    stream = iter(model().items())
    assert tel.weights.sent(stream, version=1) is stream
    assert tel.weights.received(stream, version=1) is stream
    with tel.weights.sync(version=1, side="send") as sync:
        sync.note("a", torch.ones(1))
        assert sync.manifest() is None


def _fresh(n: int, ptrs: list):
    """n same-sized tensors, each dropped once the consumer moves on: the allocator may hand
    the next one the memory of the last (ptrs records where each lived)."""
    for i in range(n):
        t = torch.full((64, 32), float(i), dtype=torch.bfloat16)
        ptrs.append(t.data_ptr())
        yield f"w{i}", t
        del t


def test_a_stream_that_drops_each_tensor_counts_every_one(proving):
    s = proving("trainer")
    ptrs: list = []
    for _ in s.weights.sent(_fresh(6, ptrs), version=1):
        pass
    st = s.weights.meter.stats
    assert (st.tensors["send"], st.bytes["send"]) == (6, 6 * 64 * 32 * 2)


@pytest.mark.parametrize("guard", [True, False])
def test_an_async_stream_that_drops_each_tensor_counts_every_one(proving, guard):
    r = proving("rollout", guard=guard)

    async def source():
        for name, t in _fresh(6, []):
            yield name, t

    async def drain():
        async for _ in r.weights.received(source(), version=1):
            pass
    asyncio.run(drain())
    st = r.weights.meter.stats
    assert (st.tensors["receive"], st.bytes["receive"]) == (6, 6 * 64 * 32 * 2)


def test_memory_reused_by_a_new_tensor_counts_again_in_a_block(proving):
    """Deterministic reuse: one buffer's memory under a new tensor object each time (what a
    freed-and-reallocated tensor looks like), and one receive buffer a collective refills."""
    s = proving("rollout")
    buf = torch.zeros(16)
    with s.weights.sync(version=2, side="receive") as sync:
        for i in range(3):
            view = buf.view(16)  # a new tensor at the same address; the last one is gone
            sync.counted(view)  # the collective's receive into it
            sync.note(f"w{i}", view)  # the same tensor noted: pairs, counts nothing more
            del view
        for i in range(2):
            sync.counted(buf)  # the same live buffer refilled by two receives: two tensors
    st = s.weights.meter.stats
    assert (st.tensors["receive"], st.bytes["receive"]) == (5, 5 * 64)
