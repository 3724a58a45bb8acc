"""Where the guard's hooks run: helper threads with OpenMP at one thread for CPU tensors, the
calling thread for anything else; the caller's own OpenMP setting never touched."""
from __future__ import annotations

import threading

import torch
from tensordict import TensorDict

from dpobs_otel.guard import pool


def _where_and_threads():
    return threading.current_thread().name, torch.get_num_threads()


def test_cpu_work_runs_on_a_helper_with_one_openmp_thread():
    before = torch.get_num_threads()
    td = TensorDict({"x": torch.zeros(3)}, batch_size=[3])
    name, threads = pool.run(_where_and_threads, where=td)
    assert name.startswith("dpobs-guard")
    if pool._openmp() is not None:  # torch's wheels ship libgomp
        assert threads == 1
    assert torch.get_num_threads() == before  # the caller's setting is its own


def test_accelerator_tensors_are_fingerprinted_on_the_calling_thread():
    td = TensorDict({"x": torch.zeros(3), "y": torch.empty(3, device="meta")}, batch_size=[3])
    assert not pool.on_cpu(td)
    name, _ = pool.run(_where_and_threads, where=td)
    assert name == threading.current_thread().name
    assert not pool.on_cpu(None) and pool.on_cpu(TensorDict({}, batch_size=[2]))


def test_a_hook_spreads_over_its_callers_thread_count():
    """On a hook's helper, width() is the caller's intra-op thread count (the helper's own
    is 1), so `torch.set_num_threads(1)` keeps the guard on one core."""
    td = TensorDict({"x": torch.zeros(3)}, batch_size=[3])
    before = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            assert pool.run(pool.width, where=td) == n
    finally:
        torch.set_num_threads(before)
    assert pool.width() == before  # off a helper: this thread's own count


def test_share_runs_work_on_crew_helpers_with_one_openmp_thread():
    seen, lock = [], threading.Lock()
    items = iter(range(64))
    go = threading.Barrier(2, timeout=10)  # some crew helper really runs alongside

    def work():
        name = threading.current_thread().name
        if name.startswith("dpobs-guard-crew"):
            try:
                go.wait()
            except threading.BrokenBarrierError:
                pass
        elif not seen:
            go.wait()
        for i in items:
            with lock:
                seen.append((i, name, torch.get_num_threads()))

    pool.share(work, 2)
    assert sorted(i for i, _, _ in seen) == list(range(64))
    crew = [t for _, name, t in seen if name.startswith("dpobs-guard-crew")]
    if crew and pool._openmp() is not None:
        assert set(crew) == {1}


def test_share_never_waits_for_a_busy_crew():
    """Every crew helper blocked elsewhere: the caller does all the work and returns."""
    release = threading.Event()
    crew = pool._named("dpobs-guard-crew", pool.CREW)
    blockers = [crew.submit(release.wait, 30) for _ in range(pool.CREW)]
    try:
        done = []
        pool.share(lambda: done.append(threading.current_thread().name), pool.CREW + 1)
        assert done == [threading.current_thread().name]
    finally:
        release.set()
        for b in blockers:
            b.result(10)


def test_a_small_put_stays_on_one_thread_and_a_large_one_spreads(monkeypatch):
    """Fields under SPREAD_MIN_BYTES in all are fingerprinted one after another on the hook's
    thread; at or over it, spread over the caller's threads. Digests the same either way."""
    import dpobs_otel as dpobs

    spread_calls = []
    real = pool.spread
    monkeypatch.setattr(pool, "spread", lambda fn, items, *a: spread_calls.append(
        len(items)) or real(fn, items, *a))
    tel = dpobs.start(role="spread", verify_tensor_hash=True)
    td = TensorDict({"a": torch.arange(4096.).reshape(64, 64), "b": torch.ones(64, 3)},
                    batch_size=[64])
    ids = [f"r{i}" for i in range(64)]
    small = tel.guard.before_put(ids, "p", td)
    assert spread_calls == []
    monkeypatch.setattr(pool, "SPREAD_MIN_BYTES", td["a"].nbytes)
    large = tel.guard.before_put(ids, "p", td)
    assert spread_calls == [2]
    assert (small == large).all()
    tel.shutdown()
