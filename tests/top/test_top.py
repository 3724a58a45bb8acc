"""`dpobs top`: the file_sd source against live endpoints whose ops the test scripts (counts and
bytes exact; times against the test's own clock; quantiles against the bucket each call must
land in), unreachable and hanging endpoints shown as down; a Prometheus that is not there;
`dpobs --help`. The live view under tmux is test_top_tmux.py."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

import dpobs_otel as dpobs
from dpobs_otel.top.direct import DirectSource
from dpobs_otel.top.prometheus import RulesSource
from dpobs_otel.top.view import ms, size
from helpers.top import refused_port, table, text

JOB = "toptest"
PART = "p"
ROWS, WIDTH = 4, 1000  # rows per put, float32 values per row
PUT_SLEEP, GET_SLEEP, STEP_SLEEP = 0.065, 0.03, 0.03
# Each call's bucket (names.OP_BUCKETS): the sleeps sit well inside these bounds, far from
# the upper one (a busy machine adds milliseconds, never takes them away).
PUT_BUCKET, GET_BUCKET = (0.05, 0.1), (0.025, 0.05)
N_STEPS = 6  # rollout: one put per step; trainer: two gets per step
WINDOW_S = 2  # `dpobs top --once --interval`: seconds between its two scrapes


class Slow:
    """The shared store, with a fixed service time per op (so shares and latencies are known),
    each call's own interval kept (`served`): what dpobs's op duration records, which leaves
    out its bookkeeping around the call (the guard's digests)."""

    def __init__(self, inner, put_s: float, get_s: float):
        self.inner, self.put_s, self.get_s = inner, put_s, get_s
        self.served: dict[str, list[float]] = {}

    def _serve(self, op: str, sleep_s: float, fn, *a, **kw):
        t0 = time.perf_counter()
        time.sleep(sleep_s)
        try:
            return fn(*a, **kw)
        finally:
            self.served.setdefault(op, []).append(time.perf_counter() - t0)

    def put_samples(self, *a, **kw):
        return self._serve("put", self.put_s, self.inner.put_samples, *a, **kw)

    def get_samples(self, *a, **kw):
        return self._serve("get", self.get_s, self.inner.get_samples, *a, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class Clock:
    """The test's own truth: outer wall time around each measured call and step."""

    def __init__(self):
        self.calls: dict[str, list[float]] = {}
        self.steps = {"rollout": 0.0, "trainer": 0.0}

    def call(self, op: str, fn, *a):
        t0 = time.perf_counter()
        out = fn(*a)
        self.calls.setdefault(op, []).append(time.perf_counter() - t0)
        return out


def list_target(sd: Path, name: str, address: str, role: str) -> None:
    doc = [{"targets": [address], "labels": {"job": JOB, "role": role, "rank": "0"}}]
    (sd / f"{name}.json").write_text(json.dumps(doc))


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A rollout and a trainer (each its own Telemetry and endpoint, listed in file_sd), one
    shared store, one warm-up step each (so every series exists before top's first scrape)."""
    for var in ("DPOBS_ROLE", "DPOBS_RANK", "DPOBS_PORT", "DPOBS_HOST", "DPOBS_SD_DIR",
                "DPOBS_JOB", "DPOBS_VERIFY_TENSOR_HASH"):
        monkeypatch.delenv(var, raising=False)
    sd = tmp_path / "sd"
    store = dpobs.InMemoryDataPlane()
    store.register_partition(PART)
    tels = {role: dpobs.start(role=role, rank=0, job=JOB, sd_dir=str(sd), port=0,
                              verify_tensor_hash=True) for role in ("rollout", "trainer")}
    slow = {role: Slow(store, PUT_SLEEP, GET_SLEEP) for role in tels}
    c = {"sd": sd, "store": store, "tels": tels, "slow": slow,
         **{role: tels[role].instrument(slow[role]) for role in tels}}
    run_steps(c, "w", 1, Clock())
    yield c
    for t in tels.values():
        t.shutdown()


def batch(step: str) -> TensorDict:
    g = torch.Generator().manual_seed(hash(step) % 1000)
    return TensorDict({"x": torch.randn(ROWS, WIDTH, generator=g)}, batch_size=[ROWS])


def ids(step: str) -> list[str]:
    return [f"{step}-{i}" for i in range(ROWS)]


def run_steps(c: dict, tag: str, n: int, clock: Clock, corrupt_at: int | None = None) -> None:
    """n steps in lockstep: the rollout puts a batch, the trainer reads it twice. corrupt_at:
    an uninstrumented writer rewrites one row of that step between the put and the reads."""
    tels = c["tels"]
    for i in range(n):
        step = f"{tag}{i}"
        t0 = time.perf_counter()
        with tels["rollout"].step():
            clock.call("put", c["rollout"].put_samples, ids(step), PART, batch(step))
            time.sleep(STEP_SLEEP)
        clock.steps["rollout"] += time.perf_counter() - t0
        if i == corrupt_at:
            bad = TensorDict({"x": torch.zeros(1, WIDTH)}, batch_size=[1])
            c["store"].put_samples(ids(step)[:1], PART, bad)
        t0 = time.perf_counter()
        with tels["trainer"].step():
            for _ in range(2):
                clock.call("get", c["trainer"].get_samples, ids(step), PART)
        clock.steps["trainer"] += time.perf_counter() - t0


def quantile_in(bucket: tuple[float, float], q: float) -> float:
    """histogram_quantile when every observation lies in one bucket: linear inside it."""
    lo, hi = bucket
    return lo + (hi - lo) * q


# no_gc: it holds each call, on the test's own clock, inside its bucket (a 20 ms margin
# above a get's sleep), so it runs alone: beside three workers a get outgrew its bucket in
# 9508aa6's fresh-clone CI.
def test_file_sd_source_answers_from_two_scrapes_of_live_endpoints(cluster, no_gc):
    sd = cluster["sd"]
    list_target(sd, "ghost", f"127.0.0.1:{refused_port()}", "ghost")
    src = DirectSource(str(sd), window_s=600, timeout=1.0)
    first = src.answers()
    assert first.window_s is None and all(p.frac_of_step is None for p in first.processes)
    clock = Clock()
    run_steps(cluster, "m", N_STEPS, clock, corrupt_at=2)
    a = src.answers()

    procs = {p.role: p for p in a.processes}
    assert set(procs) == {"rollout", "trainer", "ghost"}
    assert not procs["ghost"].up and procs["ghost"].error == "connection refused"
    assert a.processes[-1].role == "ghost"  # down ones last
    spans = {role: src.history[next(k for k in src.history if k[3] == role)] for role in
             ("rollout", "trainer")}
    span = {role: h[-1].timestamp - h[0].timestamp for role, h in spans.items()}
    (job,) = a.jobs
    ops = {o.op: o for o in job.ops}
    # Counts and bytes exactly: rates times each process's own span.
    put_bytes = N_STEPS * ROWS * WIDTH * 4
    assert job.write_bytes_per_s * span["rollout"] == pytest.approx(put_bytes, rel=1e-9)
    assert job.read_bytes_per_s * span["trainer"] == pytest.approx(2 * put_bytes, rel=1e-9)
    assert ops["put"].ops_per_s * span["rollout"] == pytest.approx(N_STEPS, rel=1e-9)
    assert ops["get"].ops_per_s * span["trainer"] == pytest.approx(2 * N_STEPS, rel=1e-9)
    # Occupancy: every put (the warm-up's too), never cleared; guard: each read checks its
    # rows, and the rewritten row mismatches on both reads of its step.
    assert job.outstanding_bytes == (N_STEPS + 1) * ROWS * WIDTH * 4
    assert (job.guard_checked, job.guard_mismatched) == (2 * N_STEPS * ROWS, 2)
    # Times between what the store's service time forces (each call sleeps) and the test's
    # own clock around each call and step (which adds dpobs's bookkeeping, the guard's
    # digests included, that op duration leaves out).
    outer = {op: sum(v) for op, v in clock.calls.items()}
    slept = {"put": PUT_SLEEP * N_STEPS, "get": GET_SLEEP * 2 * N_STEPS}
    assert slept["put"] / sum(outer.values()) <= ops["put"].share <= outer["put"] / sum(
        slept.values())
    for op in ("put", "get"):
        calls = len(clock.calls[op])
        assert slept[op] / calls <= ops[op].mean_s <= outer[op] / calls
    for role, op in (("rollout", "put"), ("trainer", "get")):
        assert slept[op] / clock.steps[role] <= procs[role].frac_of_step <= min(
            1.0, outer[op] / clock.steps[role] + 0.02)
    assert job.max_frac_of_step == procs["trainer"].frac_of_step
    assert a.processes[0].role == "trainer"  # worst first
    # Quantiles: every call in its bucket (checked on the store's own interval, which the op
    # duration holds, with 5 ms to spare for the call's way in and out; the test's outer
    # clock also holds the guard's digests: 54 ms for a 30 ms get on a slow machine), so
    # histogram_quantile's interpolation is known exactly.
    served = {"put": cluster["slow"]["rollout"].served["put"][-N_STEPS:],
              "get": cluster["slow"]["trainer"].served["get"][-2 * N_STEPS:]}
    for op, bucket in (("put", PUT_BUCKET), ("get", GET_BUCKET)):
        assert all(bucket[0] < d < bucket[1] - 0.005 for d in served[op]), served[op]
        assert ops[op].p90_s == pytest.approx(quantile_in(bucket, 0.9), rel=1e-9)
        assert ops[op].p99_s == pytest.approx(quantile_in(bucket, 0.99), rel=1e-9)
    shown = text(a)
    assert "DOWN (connection refused)" in shown and "Processes (2 up, 1 down)" in shown
    assert size(job.read_bytes_per_s, "/s") in shown and ms(ops["put"].p99_s) in shown
    assert "Alerts: only with --prometheus" in shown


def test_a_window_counts_only_what_happened_inside_it(cluster):
    """Snapshots older than the window are dropped: the rates then cover the newest steps."""
    window = 1.5
    src = DirectSource(str(cluster["sd"]), window_s=window, timeout=1.0)

    def answer_a_window_after(t0: float) -> float:
        time.sleep(max(0.0, t0 + window + 0.2 - time.time()))
        src.answers()
        return time.time()

    t = answer_a_window_after(0)
    run_steps(cluster, "a", 2, Clock())
    t = answer_a_window_after(t)
    run_steps(cluster, "b", 3, Clock())
    answer_a_window_after(t)
    a = src.answers()  # as soon as possible: still within a window of the previous one
    ops = {o.op: o for o in a.jobs[0].ops}
    h = src.history[next(k for k in src.history if k[3] == "rollout")]
    assert len(h) == 3  # the snapshot at the window's start, and the two since
    assert ops["put"].ops_per_s * (h[-1].timestamp - h[0].timestamp) == pytest.approx(3)


def test_a_process_that_appears_after_top_started_counts_its_guard_rows_whole(cluster):
    """Like the rules' born-in-the-window series: its rows checked before top's first look
    at it count (else one corrupted row read by a short-lived process would never show)."""
    src = DirectSource(str(cluster["sd"]), window_s=600, timeout=1.0)
    src.answers()
    late = dpobs.start(role="late", rank=0, job=JOB, sd_dir=str(cluster["sd"]), port=0,
                       verify_tensor_hash=True)
    try:
        client = late.instrument(cluster["store"])
        for i in range(3):  # the warm-up step's rows, read by a newcomer
            client.get_samples(ids("w0"), PART)
        src.answers()  # its first snapshot: no rate yet
        (job,) = src.answers().jobs
    finally:
        late.shutdown()
    assert (job.guard_checked, job.guard_mismatched) == (3 * ROWS, 0)


def test_an_endpoint_that_never_answers_is_down_and_does_not_hold_up_the_view(cluster):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts, never answers
    try:
        list_target(cluster["sd"], "silent", f"127.0.0.1:{silent.getsockname()[1]}", "silent")
        (cluster["sd"] / "garbage.json").write_text("{not json")
        src = DirectSource(str(cluster["sd"]), timeout=0.5)
        t0 = time.monotonic()
        a = src.answers()
        assert time.monotonic() - t0 < 5
    finally:
        silent.close()
    procs = {p.role: p for p in a.processes}
    assert set(procs) == {"rollout", "trainer", "silent"}
    assert not procs["silent"].up and "timed out" in procs["silent"].error
    assert procs["rollout"].up and procs["trainer"].up


def test_dpobs_top_once_prints_a_frame_from_the_file_sd_directory(cluster):
    done, cycles, steps = threading.Event(), [], {role: [] for role in Clock().steps}

    def work():  # steps keep coming while top takes its two scrapes
        i = 0
        while not done.is_set():
            clock, t0 = Clock(), time.perf_counter()
            run_steps(cluster, f"o{i}-", 1, clock)
            cycles.append(time.perf_counter() - t0)
            for role, d in clock.steps.items():
                steps[role].append(d)
            i += 1

    worker = threading.Thread(target=work)
    worker.start()
    try:
        out = subprocess.run([sys.executable, "-m", "dpobs_otel.cli", "top", "--sd-dir",
                              str(cluster["sd"]), "--once", "--interval", str(WINDOW_S),
                              "--timeout", "10"],
                             capture_output=True, text=True, timeout=60,
                             env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"})
    finally:
        done.set()
        worker.join()
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {r["role"]: r for r in table(out.stdout, "Processes")}  # (a slow box: 10 s)
    assert set(rows) == {"rollout", "trainer"}
    for role, r in rows.items():
        frac = float(r["frac_of_step"].rstrip("%")) / 100
        assert r["state"] == "up" and 0 < frac <= edge_bound(cycles, steps[role]), out.stdout
    ops = {r["op"]: r for r in table(out.stdout, "Ops")}
    assert set(ops) == {"put", "get"} and float(ops["get"]["p99 ms"]) > GET_SLEEP * 1e3


def edge_bound(cycles: list[float], steps: list[float]) -> float:
    """The most a role's frac_of_step can read over top's window while its ops lie inside its
    steps. A step's seconds count when it ends, its ops as each one ends, so a step open at
    the second scrape adds its ops without its seconds: at most one step's worth over the
    step seconds of the window, which holds at least floor(W / longest cycle) - 1 whole
    cycles. (100.9% was seen for the trainer, whose steps are all ops.)"""
    whole = int(WINDOW_S // max(cycles)) - 1
    return 1 + max(steps) / (whole * min(steps)) if whole > 0 else float("inf")


def test_a_prometheus_that_is_not_there_is_an_error_line_not_a_crash():
    url = f"http://127.0.0.1:{refused_port()}"
    a = RulesSource(url, timeout=1).answers()
    assert "unreachable" in a.error and a.jobs == [] and a.processes == []
    shown = text(a)  # the live view: the header and the error, no empty tables under it
    assert "source error" in shown and "Jobs" not in shown and "only with" not in shown
    out = subprocess.run([sys.executable, "-m", "dpobs_otel.cli", "top", "--prometheus", url,
                          "--once"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == ""  # --once: one line, no frame
    assert len(out.stderr.splitlines()) == 1 and "unreachable" in out.stderr, out.stderr
    assert out.stderr.startswith("dpobs top: ") and url in out.stderr


def test_dpobs_help_lists_every_command_on_one_line():
    from dpobs_otel.cli import COMMANDS
    out = subprocess.run([sys.executable, "-m", "dpobs_otel.cli", "--help"],
                         capture_output=True, text=True, timeout=60, env={"COLUMNS": "80"})
    lines = out.stdout.splitlines()
    for name, (_, helptext) in COMMANDS.items():
        assert any(line.split()[:1] == [name] and line.strip().endswith(helptext)
                   for line in lines), (name, out.stdout)
