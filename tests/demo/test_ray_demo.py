"""`dpobs demo --backend ray --nodes 2` end to end (a Ray cluster of two nodes on 127.0.0.1,
its actors measured the zero-code way, a Prometheus with the shipped rules): every process's
Ray ops per method against the workload's own truth (calls, keys and Ray's object sizes
exactly; the driver's seconds against its own timer around each call, over the measured steps
alone), the bytes that crossed nodes and between which, the driver's data time and
frac_of_step, the hub share, the report's table, and the flags the plane refuses."""
from __future__ import annotations

import importlib.util
import os

import pytest

from dpobs_otel import names as nm
from dpobs_otel.demo import command, compare, ray_plane, ray_report
from dpobs_otel.demo import report as demo
from dpobs_otel.demo.batches import Config
from dpobs_otel.testing.stack import Stack, binaries

# In the serial pass (Makefile, `alone`): the driver's seconds are weighed against the
# workload's own timer around each call, and beside three other workers dpobs's share of a
# ray_call read 0.71 of it once (the bound is 0.75), the rest spent waiting for a CPU.
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="the ray extra is not installed")]
STEPS = 30


@pytest.fixture(scope="module")
def stack():
    missing = [n for n, p in binaries().items() if p is None]
    if missing:
        pytest.skip(f"not on PATH: {', '.join(missing)}")
    with Stack(interval=compare.INTERVAL) as s:
        yield s


@pytest.fixture(scope="module")
def run(stack):
    """One run on two nodes: its Result, the report, and the driver's samples right after the
    warm-up (start() returns then; the driver waits for the measure event before step 1)."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("DPOBS_")}
    cfg = Config(steps=STEPS, trainers=2, batch_size=256, backend="ray", job="raydemo",
                 nodes=2, sd_dir=stack.sd_dir)
    after_warmup = {}

    def baseline(wl):
        after_warmup["driver"] = demo.scrape(wl.info[("driver", 0)]["endpoint"])
    try:
        with demo.session(cfg, stack, on_ready=baseline) as res:
            # The rules rate each process's counters over their own samples: as `dpobs
            # compare` does, every series gets enough of them that rate()'s extrapolation at
            # the ends weighs little (the hub share compares processes scraped apart).
            compare._settle(stack, f'job="{cfg.job}"')
            yield res, ray_report.report(res, cfg, stack), after_warmup["driver"]
    finally:
        os.environ.update(saved)


def test_every_process_is_announced_with_its_role(run):
    res, _, _ = run
    assert sorted(res.info) == [("driver", 0), ("rollout", 0), ("trainer", 0), ("trainer", 1)]
    assert all(res.scraped[k] for k in res.info)


def test_counts_keys_and_bytes_per_method_equal_the_truth(run):
    res, _, _ = run
    truth, metrics = ray_report.truth_rows(res), ray_report.metric_rows(res.scraped)
    assert set(metrics) == set(truth)  # no op or method the workload did not make
    for key, (calls, _, nbytes, keys) in truth.items():
        m = metrics[key]
        assert (m[0], m[2], m[3]) == (calls, nbytes, keys), key
    steps = STEPS + 1  # the warm-up too: counters hold it
    gen = ("rollout", nm.RAY_RETURN, ray_plane.GEN)
    assert truth[gen][0] == steps and truth[gen][2] > 0
    upd = ("trainer", nm.RAY_ARGS, ray_plane.UPDATE)  # two refs an update: shard, log-probs
    assert truth[upd][0] == 2 * steps and truth[upd][3] == 4 * steps
    # by ref only: the calls' submissions carry no bytes
    assert all(truth[("driver", nm.RAY_CALL, m)][2] == 0 for m in
               (ray_plane.GEN, ray_plane.LOGPROB, ray_plane.UPDATE))


# Per op, how far below the workload's timer dpobs's seconds may lie. A put or a call's
# submission takes a fraction of a millisecond and the adapter's own work after Ray returns
# (the refs a call returned, the record appended) lies inside the workload's timer and
# outside the op's. The driver's gets follow a ray.wait (ray_plane._get), so they too are
# a fraction of a millisecond of moving data and take a put's bound; the wait, which holds
# what a get used to (the producer's time), keeps the 5%.
# A call's submission, a few hundred microseconds, runs beside the driver's /metrics collection
# four times a second (the stack's 250 ms interval, for the hub share): what the collection
# holds of the GIL after Ray returns falls in the timer only. Up to a third below it on a
# slow machine (0.020 s against 0.031 over 31 calls); its bound is a half.
BELOW = {nm.RAY_GET: 0.25, nm.RAY_PUT: 0.25, nm.RAY_CALL: 0.5, nm.RAY_WAIT: 0.05}
METHOD_BELOW = 0.5  # a method's calls and get: sub-millisecond ops as above


def test_the_driver_s_seconds_per_method_agree_with_its_own_timers(run):
    res, _, warm = run
    truth = res.truth[("driver", 0)]["ray"]  # the measured steps
    end = ray_report.metric_rows({("driver", 0): res.scraped[("driver", 0)]})
    start = ray_report.metric_rows({("driver", 0): warm})
    assert {op for op, _ in truth} == set(BELOW)
    per_method = {}
    for (op, method), (calls, seconds, _, _) in truth.items():
        key = ("driver", op, method)
        measured = end[key][1] - start.get(key, [0, 0.0])[1]
        assert end[key][0] - start.get(key, [0])[0] == calls, key
        # dpobs times inside the workload's timer: never more, and not far less
        assert (1 - BELOW[op]) * seconds <= measured <= seconds, (key, measured, seconds)
        if method:
            m = per_method.setdefault(method, [0.0, 0.0])
            m[0], m[1] = m[0] + measured, m[1] + seconds
    assert len(per_method) == 3
    waits = [key for key in truth if key[0] == nm.RAY_WAIT]
    assert waits == [(nm.RAY_WAIT, "")]  # a wait carries no method (DESIGN.md)
    for method, (measured, seconds) in per_method.items():
        assert (1 - METHOD_BELOW) * seconds <= measured <= seconds, (method, measured, seconds)


def test_the_driver_steps_and_owns_what_it_still_holds(run):
    res, text, _ = run
    driver = res.scraped[("driver", 0)]
    assert demo.metric_sum(driver, f"{nm.STEP_DURATION_SERIES}_count") == STEPS + 1
    assert demo.metric_sum(driver, nm.RAY_OWNED_SERIES) > 0
    assert f"Driver steps: {STEPS + 1} (metrics {STEPS + 1})" in text
    assert ray_plane.GEN in text and "ray_return" in text


@pytest.mark.parametrize("flag", ["--verify-tensor-hash", "--prefetch", "--async=2"])
def test_flags_that_need_a_store_are_refused_with_the_reason(flag):
    import argparse
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    with pytest.raises(SystemExit) as exc:
        demo.config(p.parse_args(["--backend", "ray", flag]))
    assert "--backend ray does not take" in str(exc.value)
    if flag == "--verify-tensor-hash":
        assert "the guard does not ride Ray's object store" in str(exc.value)


def test_the_bytes_that_crossed_nodes_equal_ray_s_locations(run):
    """Per op and method, dpobs's remote bytes against the objects that had no copy on the
    reader's node when it asked (Ray's locations, read before each op): exactly, for the
    driver's gets. The two-node placement makes some of each kind: the driver pulls the
    rollout's batch, the rollout and trainer 0 (away from the driver) pull what the driver
    put; a worker's argument passed by ref is fetched inside Ray's core before any hook, so
    dpobs counts its bytes where it cannot say where they were (unknown), never remote."""
    res, text, _ = run
    truth, _ = ray_report.truth_crossed(res)
    gets = {k: v for k, v in truth.items() if k[1] == nm.RAY_GET}
    args = {k: v for k, v in truth.items() if k[1] == nm.RAY_ARGS}
    gen, logprob = (("driver", nm.RAY_GET, m) for m in (ray_plane.GEN, ray_plane.LOGPROB))
    assert {gen, logprob} <= set(gets)
    assert {("rollout", nm.RAY_ARGS, ray_plane.GEN),
            ("trainer", nm.RAY_ARGS, ray_plane.LOGPROB)} <= set(args)
    remote = ray_report.metric_moved(res.scraped, nm.RAY_REMOTE_LOCALITY)
    assert set(remote) == set(gets) and remote[gen] == gets[gen]
    # The log-probs: on a slow machine one object a run (261,077 bytes of 7,856,404) read
    # remote in the driver's own table and not in its owner's answer (get_object_locations)
    # read just before; not yet understood: within two steps' worth, never below the truth
    assert gets[logprob] <= remote[logprob] <= gets[logprob] * (1 + 2 / (STEPS + 1))
    unknown = ray_report.metric_moved(res.scraped, nm.RAY_UNKNOWN)
    assert all(unknown.get(k, 0) >= v for k, v in args.items()), (unknown, args)
    assert "Bytes that crossed nodes" in text


def test_remote_bytes_name_the_source_node_and_the_reader_names_its_own(run):
    res, _, _ = run
    _, pairs = ray_report.truth_crossed(res)
    pairs = {(src, dst): v for (op, src, dst), v in pairs.items() if op == nm.RAY_GET}
    got = {}
    for key, samples in res.scraped.items():
        own = {lb[nm.RAY_NODE_LABEL] for n, lb, v in samples if n == nm.RAY_NODE_SERIES and v}
        assert len(own) == 1, key  # every measured process names its NodeID
        for n, lb, v in samples:
            if n == nm.RAY_REMOTE_SERIES:
                pair = (lb[nm.RAY_FROM_NODE], *own)
                got[pair] = got.get(pair, 0) + v
    assert set(got) == set(pairs)  # the pairs exactly; their bytes as the test above says
    assert all(pairs[p] <= got[p] <= pairs[p] * (1 + 2 / (STEPS + 1)) for p in pairs)


def test_frac_of_step_from_the_rules_is_the_driver_s_data_time(run, stack):
    """The driver's Ray data time over its step time: from its own timers, from its series,
    and from the rules, within 5% (the rules' window starts at the driver's first scrape,
    somewhere in the warm-up)."""
    res, text, _ = run
    data, step = ray_report.truth_data(res)
    assert 0 < data < step
    prom = stack.query(nm.JOB_FRAC_OF_STEP)
    assert len(prom) == 1
    assert prom[0]["value"] == pytest.approx(data / step, rel=0.05)
    assert "frac_of_step" in text


def test_the_hub_share_from_the_rules_is_the_driver_s_share_of_the_bytes(run, stack):
    res, _, _ = run
    shares = ray_report.truth_shares(res)
    hub = max(shares, key=shares.get)
    assert hub == ("driver", 0)
    prom = stack.query(nm.JOB_RAY_HUB_SHARE)
    assert len(prom) == 1
    every = ray_report.truth_shares(res, measured_only=False)
    # The counters hold the truth's bytes exactly; the rule rates each process's counter over
    # its own samples, and rate()'s extrapolation at their ends differs between processes
    # scraped at different moments: within 5% once each has compare's SETTLE samples.
    assert ray_report.metric_shares(res.scraped) == pytest.approx(every, rel=1e-9)
    assert prom[0]["value"] == pytest.approx(shares[hub], rel=0.05)
