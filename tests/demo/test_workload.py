"""Fast tests of the demo's pieces: the batch, the truth it measures, the lockstep loop (in
threads, on an in-process store), the report arithmetic, and the stack's config rewrite."""
from __future__ import annotations

import argparse
import io
import queue
import shutil
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace

from prometheus_client import generate_latest

import pytest
import torch
import yaml

import dpobs_otel as dpobs
from dpobs_otel.demo import command
from dpobs_otel.demo import report as demo
from dpobs_otel.demo.progress import Progress
from dpobs_otel.sizing import payload_nbytes
from dpobs_otel.testing.stack import later_than, prometheus_config
from dpobs_otel.demo.critical import counters
from dpobs_otel.demo.batches import (PARTITION, ROLE_OPS, Config, make_rows, pack, truth_nbytes,
                                     unpack)
from dpobs_otel.demo.truth import Durations, Timed, Truth
from dpobs_otel.demo.workload import Sync, _Worker, metrics_on

CFG = Config(batch_size=12, min_len=3, max_len=9, trainers=2, latency_s=0.0)


def test_batch_is_grpo_shaped_and_reproducible():
    rows = make_rows(5, CFG, torch.Generator().manual_seed(0))
    td = pack(rows)
    assert td.batch_size == torch.Size([12])
    assert td["tokens"].is_nested and td["tokens"].dtype == torch.int64
    assert td["logprobs"].is_nested and td["mask"].dtype == torch.bool
    assert td["advantages"].shape == (12,)
    lens = [len(t) for t in rows["tokens"]]
    assert all(3 <= n <= 9 for n in lens) and lens == [len(m) for m in rows["mask"]]
    # advantages are normalised within each group of completions
    assert torch.allclose(td["advantages"].view(-1, 4).mean(1), torch.zeros(3), atol=1e-5)
    again = make_rows(5, CFG, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(rows["tokens"], again["tokens"]))
    assert [u["uid"] for u in td["meta"]][:2] == ["s00000005-00000", "s00000005-00001"]
    seqs = unpack(td)
    assert [len(t) for t in seqs["tokens"]] == lens and len(seqs["meta"]) == 12


@pytest.mark.parametrize("n", [5, 40])  # under and over sizing.py's exact-walk row limit
def test_truth_bytes_agree_with_dpobs_sizing_before_and_after_the_store(n):
    cfg = Config(batch_size=n, min_len=1, max_len=30)
    td = pack(make_rows(123456, cfg, torch.Generator().manual_seed(1)))
    tensors = sum(td[k].values().nbytes for k in ("tokens", "logprobs", "mask")) + n * 4
    assert truth_nbytes(td) > tensors  # metadata counted too
    assert truth_nbytes(td) == payload_nbytes(td)
    store = dpobs.InMemoryDataPlane()
    ids = [str(i) for i in range(n)]
    store.put_samples(ids, "p", td)
    back = store.get_samples(ids[1:], "p", None)
    assert truth_nbytes(back) == payload_nbytes(back)


def test_timed_times_only_the_workloads_own_ops():
    class Inner:
        def put_samples(self, *a):
            return "put"

        def list_sample_ids(self, p):
            return ["x"]

    t = Timed(Inner(), {"put"})
    assert t.put_samples(["a"], "p") == "put"
    assert t.list_sample_ids("p") == ["x"]  # dpobs's reconciliation: not the workload's
    assert list(t.durations) == ["put"] and len(t.durations["put"]) == 1
    truth = Truth(t)
    truth.moved("put", "write", 10)
    truth.moved("put", "write", 5)
    got = truth.take()
    assert got["bytes"] == {("put", "write"): 15} and len(got["ops"]["put"]) == 1
    assert truth.take()["bytes"] == {} and t.durations == {}


def run_in_threads(cfg: Config):
    """The processes' loop, as threads on one in-process store: the lockstep, the truth and
    what each Telemetry counted, in a second."""
    store = dpobs.InMemoryDataPlane()
    roles = cfg.roles()
    sync = Sync(threading.Barrier(len(roles), timeout=30), SimpleNamespace(value=0),
                threading.Event(), threading.Event(), threading.Event())
    sync.measure.set()
    out, results, errors = queue.Queue(), {}, []

    def body(role, rank):
        tel = dpobs.start(role=role, rank=rank, verify_tensor_hash=cfg.verify)
        try:
            timed = Timed(store, ROLE_OPS[role])
            truth = Truth(timed)
            _Worker(role, rank, cfg, tel, tel.instrument(timed), store, truth, sync,
                    out).loop()
            samples = demo.parse_metrics(generate_latest(tel.registry).decode())
            results[(role, rank)] = (truth.take(), tel.stats, samples)
        except BaseException as exc:
            errors.append(exc)
            sync.barrier.abort()
        finally:
            tel.shutdown()

    threads = [threading.Thread(target=body, args=rr) for rr in roles]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    msgs = []
    while not out.empty():
        msgs.append(out.get())
    return store, results, msgs


def test_lockstep_steps_truth_and_metrics_agree():
    store, results, msgs = run_in_threads(Config(**{**CFG.__dict__, "steps": 4}))
    assert store.list_sample_ids(PARTITION) == []  # the driver cleared every step
    assert sorted(m[1] for m in msgs if m[0] == "step") == [1, 2, 3, 4]
    assert {(m[1], m[2]) for m in msgs if m[0] == "warm"} == set(CFG.roles())
    for (role, rank), (truth, stats, _) in results.items():
        assert truth["steps"] == 4 and stats.steps == 5  # the warm-up is step 0
        for op, durations in truth["ops"].items():
            assert len(durations) == 4 * (2 if op == "get" else 1)
    trainer, tstats, _ = results[("trainer", 1)]
    assert tstats.ops["get"].read_bytes > trainer["bytes"][("get", "read")] > 0  # + warm-up
    rollout, rstats, _ = results[("rollout", 0)]
    assert rstats.ops["put"].calls == 5 and rollout["bytes"][("put", "write")] > 0


@pytest.mark.usefixtures("no_gc")
@pytest.mark.parametrize("prefetch", [False, True], ids=["lockstep", "prefetch"])
def test_busy_and_exposed_agree_with_the_workloads_clock(prefetch):
    """Each process's counters against the time its own clock saw: calls in flight during its
    steps (busy) and its step thread blocked on data (exposed), within 0.02 of step time."""
    cfg = Config(**{**CFG.__dict__, "steps": 6, "latency_s": 0.01, "prefetch": prefetch,
                    "train_ms": 40.0, "rollout_ms": 5.0})
    store, results, msgs = run_in_threads(cfg)
    warm = {(m[1], m[2]): m[3] for m in msgs if m[0] == "warm"}
    if prefetch:  # the last step's read-ahead stays; every finished step was cleared
        assert sorted(store.list_sample_ids(PARTITION)) == sorted(
            f"s7-{i}" for i in range(cfg.batch_size))
    for (role, rank), (measured, stats, samples) in results.items():
        m, truth = counters(samples), demo.merge([warm[(role, rank)], measured])
        for key in ("busy_s", "exposed_s"):  # the counters hold the warm-up step too
            assert truth[key] / truth["step_s"] == pytest.approx(
                m[key] / m["step_s"], abs=0.02), (role, key)
        if role == "trainer" and prefetch:  # the read-ahead overlaps training
            assert m["exposed_s"] < 0.5 * m["busy_s"]
        else:  # synchronous calls on the step thread: all three agree
            assert m["exposed_s"] == pytest.approx(m["busy_s"], rel=1e-6)
            assert m["busy_s"] == pytest.approx(m["dp"], rel=1e-6)


def test_corrupting_one_row_is_caught_by_the_guard():
    cfg = Config(**{**CFG.__dict__, "steps": 3, "verify": True, "corrupt_at": 2})
    _, results, _ = run_in_threads(cfg)
    samples = [s for _, _, got in results.values() for s in got]
    mismatched = [(lab["field"], v) for n, lab, v in samples
                  if n == "dpobs_guard_rows_mismatched_total"]
    assert [m for m in mismatched if m[1]] == [("advantages", 1.0)]
    assert len(mismatched) > 1  # the clean fields are exported too, at zero
    assert demo.metric_sum(samples, "dpobs_guard_rows_checked_total") > 0
    # the verifier's scores were written without the guard: read back, never counted clean
    assert demo.metric_sum(samples, "dpobs_guard_rows_unverified_total") == \
        cfg.batch_size * 4  # the warm-up and three measured train passes


def test_durations_stay_bounded_and_exact_in_count_and_total():
    d = Durations()
    d.CAP = 10
    for i in range(1000):
        d.add(float(i))
    assert len(d) == 1000 and d.total == sum(range(1000)) and len(d.kept) == 10
    assert max(d.kept) > 100  # the sample keeps drawing from later calls


def test_benchmark_pairs_one_step_on_one_off_in_either_order():
    pairs = [(metrics_on(s), metrics_on(s + 1)) for s in range(1, 200, 2)]
    assert all(a != b for a, b in pairs)
    assert 20 < sum(a for a, _ in pairs) < 80


def test_truth_arithmetic():
    def durations(*xs):
        d = Durations()
        for x in xs:
            d.add(x)
        return d

    a = {"steps": 2, "step_s": 4.0, "busy_s": 1.5, "exposed_s": 1.0,
         "bytes": {("get", "read"): 10},
         "ops": {"get": durations(0.5, 0.5), "put": durations(1.0)}}
    b = {"steps": 1, "step_s": 2.0, "busy_s": 1.0, "exposed_s": 0.25,
         "bytes": {("get", "read"): 5}, "ops": {"get": durations(1.0)}}
    m = demo.merge([a, b])
    assert m["steps"] == 3 and m["bytes"] == {("get", "read"): 15}
    assert (m["busy_s"], m["exposed_s"]) == (2.5, 1.25)
    assert demo.frac_of_step(m) == pytest.approx(3.0 / 6.0)
    assert demo.op_shares(m) == pytest.approx({"get": 2 / 3, "put": 1 / 3})
    assert demo.quantile([1, 2, 3, 4], 0.5) == 2.5
    assert demo.quantile(m["ops"]["get"], 0.5) == 0.5 and len(m["ops"]["get"]) == 3
    # histogram_quantile: rank 0.5*10=5 lies halfway through the (1, 2] bucket
    assert demo.bucket_quantile({1.0: 4, 2.0: 6, float("inf"): 10}, 0.5) == 1.5
    assert demo.bucket_quantile({1.0: 4, float("inf"): 10}, 0.9) == 1.0


def test_compose_flags_parse():
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    args = p.parse_args("--stack off --sd-dir /sd --host 0.0.0.0 --advertise-host demo "
                        "--duration 0".split())
    cfg = demo.config(args)
    assert (args.stack, cfg.sd_dir, cfg.host, cfg.advertise_host, cfg.duration) == \
        ("off", "/sd", "0.0.0.0", "demo", 0)
    with pytest.raises(SystemExit):
        demo.config(p.parse_args(["--min-len", "9", "--max-len", "3"]))


def test_progress_without_a_terminal_prints_plain_lines():
    s = io.StringIO()
    bar = Progress(Config(steps=10), s)
    bar(1, 0.1, 0.1)
    bar(2, 0.1, 1.0)  # within 10 s of the last line: quiet
    bar(9, 0.1, 11.0)
    lines = s.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("[" + "#" * 27) and "9/10 steps" in lines[1]


def test_a_stack_waits_for_answers_later_than_its_mark():
    assert later_than("1970-01-01T00:00:01.5Z", 1.4)
    assert not later_than("1970-01-01T02:00:01+02:00", 1.0)  # 1.0 s: not later
    assert not later_than("0001-01-01T00:00:00Z", -1e12)  # Prometheus's "never"


def test_stack_config_points_the_deploy_config_at_this_machine(tmp_path):
    cfg = prometheus_config(str(tmp_path / "sd"), "127.0.0.1:9999")
    assert cfg["global"]["scrape_interval"] == cfg["global"]["evaluation_interval"] == "1s"
    assert cfg["rule_files"] and all(Path(f).is_absolute() and Path(f).exists()
                                     for f in cfg["rule_files"])
    assert [t for am in cfg["alerting"]["alertmanagers"] for sc in am["static_configs"]
            for t in sc["targets"]] == ["127.0.0.1:9999"]
    files = [f for sc in cfg["scrape_configs"] for sd in sc.get("file_sd_configs", [])
             for f in sd["files"]]
    assert files == [str(tmp_path / "sd" / "*.json")]
    promtool = shutil.which("promtool")
    assert promtool, "promtool not on PATH"
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    check = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
