"""A weight push between three real processes over gloo (one trainer, two rollout receivers):
the exported bytes and tensors equal what the processes moved, every tensor is checked, and
each corruption one receiver makes is caught under its reason, in its version only, while the
clean receiver shows none; the fingerprints travel out of band, through the group's store.
And a receiver without dpobs, beside a sender whose guard is on, sees exactly what it sees
with no dpobs anywhere: the same items, name by name, bytes for bytes, in the same order."""
from __future__ import annotations

import multiprocessing as mp

import pytest
from helpers import value
from helpers import weights_gloo as wg
from helpers.weights_live import collected

from dpobs_otel import names

WORLD = 3
EXPECTED = {"flip": "value", "swap": "value", "dtype": "value", "missing": "missing",
            "extra": "unexpected"}


@pytest.fixture(scope="module")
def pushed():
    ctx = mp.get_context("spawn")
    out, release, port = ctx.Queue(), ctx.Event(), ctx.Value("i", 0)
    return collected([ctx.Process(target=wg.run, args=(r, WORLD, port, out, release))
                      for r in range(WORLD)], out, release)


def _seen(sender_dpobs: bool) -> dict:
    """{rank: [(version, items)]} of two receivers without dpobs."""
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), ctx.Value("i", 0)
    procs = [ctx.Process(target=wg.seen, args=(r, WORLD, port, out, sender_dpobs))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        got: dict = {}
        for _ in range(len(wg.VERSIONS) * (WORLD - 1) + 1):
            rank, v, items = out.get(timeout=240)
            got.setdefault(rank, []).append((v, items))
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return got


def test_a_receiver_without_dpobs_sees_exactly_what_it_sees_without_dpobs_anywhere():
    guarded, plain = _seen(sender_dpobs=True), _seen(sender_dpobs=False)
    assert guarded.pop(0) == [(None, True)]  # the sender ran dpobs, its posts all done
    plain.pop(0)
    for rank in range(1, WORLD):
        assert [v for v, _ in guarded[rank]] == list(wg.VERSIONS)
        for (v, got), (_, want) in zip(guarded[rank], plain[rank]):
            assert [i[0] for i in got] == [i[0] for i in want] == list(wg.model(v)), v
            assert got == want, v


def _sent_truth():
    models = [wg.model(v) for v in wg.VERSIONS]
    return (sum(t.numel() * t.element_size() for m in models for t in m.values()),
            sum(len(m) for m in models))


def test_bytes_and_tensors_are_exactly_what_moved(pushed):
    nbytes, tensors = _sent_truth()
    sender = pushed[0][0]
    assert value(sender, names.WEIGHTS_TRANSFERRED_SERIES, side="send") == nbytes
    assert value(sender, names.WEIGHTS_TENSORS_SERIES, side="send") == tensors
    assert value(sender, names.WEIGHTS_SYNC_DURATION_SERIES + "_count",
                 side="send") == len(wg.VERSIONS)
    for rank in (1, 2):
        samples, truth, _ = pushed[rank]
        assert value(samples, names.WEIGHTS_TRANSFERRED_SERIES, side="receive") == truth["bytes"]
        assert value(samples, names.WEIGHTS_TENSORS_SERIES, side="receive") == truth["tensors"]
        assert value(samples, names.WEIGHTS_VERSION_SERIES, side="receive") == max(wg.VERSIONS)
    assert pushed[2][1]["bytes"] == nbytes  # the clean receiver got every byte


def test_the_clean_receiver_checks_every_tensor_and_flags_none(pushed):
    samples, _, checks = pushed[2]
    assert value(samples, names.WEIGHTS_CHECKED_SERIES) == _sent_truth()[1]
    for reason in names.WEIGHT_MISMATCH_REASONS:
        assert value(samples, names.WEIGHTS_MISMATCHED_SERIES, reason=reason) == 0
    assert all(not c for c in checks.values())


def test_each_corruption_is_caught_in_its_version_under_its_reason(pushed):
    samples, _, checks = pushed[1]
    for v in wg.VERSIONS:
        how = wg.TAMPER.get(v)
        assert checks[v] == ({EXPECTED[how]: 1} if how else {}), (v, how)
    per_reason = {r: sum(1 for how in wg.TAMPER.values() if EXPECTED[how] == r)
                  for r in names.WEIGHT_MISMATCH_REASONS}
    for reason, n in per_reason.items():
        assert value(samples, names.WEIGHTS_MISMATCHED_SERIES, reason=reason) == n
    # every sent tensor, plus the one that arrived unannounced
    assert value(samples, names.WEIGHTS_CHECKED_SERIES) == _sent_truth()[1] + 1
