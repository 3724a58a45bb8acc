"""`dpobs top`: the file_sd source against live endpoints whose ops the test scripts (counts and
bytes exact; times against the test's own clock; quantiles against the bucket each call must
land in), unreachable and hanging endpoints shown as down; a Prometheus that is not there;
and the live view under tmux against the demo's stack, its pane compared with the recording
rules queried from the same Prometheus (the workload paused while comparing)."""
from __future__ import annotations

import io
import json
import os
import re
import shlex
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
from dpobs_otel.top.prometheus import PrometheusSource
from dpobs_otel.top.view import frame, ms, size

JOB = "toptest"
PART = "p"
ROWS, WIDTH = 4, 1000  # rows per put, float32 values per row
PUT_SLEEP, GET_SLEEP, STEP_SLEEP = 0.065, 0.03, 0.03
# Each call's bucket (names.OP_BUCKETS): the sleeps sit well inside these bounds, far from
# the upper one (a busy machine adds milliseconds, never takes them away).
PUT_BUCKET, GET_BUCKET = (0.05, 0.1), (0.025, 0.05)
N_STEPS = 6  # rollout: one put per step; trainer: two gets per step


def text(answers, width: int = 160) -> str:
    from rich.console import Console
    buf = io.StringIO()
    Console(file=buf, width=width, color_system=None).print(frame(answers))
    return buf.getvalue()


def table(shown: str, title: str) -> list[dict[str, str]]:
    """The rows of one table of a frame, as {column header: cell} (cells are separated by
    at least two spaces; headers and cells hold at most single spaces)."""
    lines = shown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rule = next(i for i in range(start, len(lines)) if lines[i].strip().startswith("─"))
    cols = re.split(r"\s{2,}", lines[rule - 1].strip())
    rows = []
    for line in lines[rule + 1:]:
        if not line.strip():
            break
        rows.append(dict(zip(cols, re.split(r"\s{2,}", line.strip()), strict=True)))
    return rows


class Slow:
    """The shared store, with a fixed service time per op (so shares and latencies are known)."""

    def __init__(self, inner, put_s: float, get_s: float):
        self.inner, self.put_s, self.get_s = inner, put_s, get_s

    def put_samples(self, *a, **kw):
        time.sleep(self.put_s)
        return self.inner.put_samples(*a, **kw)

    def get_samples(self, *a, **kw):
        time.sleep(self.get_s)
        return self.inner.get_samples(*a, **kw)

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


def refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: connecting is refused


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
    c = {"sd": sd, "store": store, "tels": tels,
         "rollout": tels["rollout"].instrument(Slow(store, PUT_SLEEP, GET_SLEEP)),
         "trainer": tels["trainer"].instrument(Slow(store, PUT_SLEEP, GET_SLEEP))}
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


def test_file_sd_source_answers_from_two_scrapes_of_live_endpoints(cluster):
    sd, tels = cluster["sd"], cluster["tels"]
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
    # Quantiles: every call in its bucket (checked on the test's clock), so
    # histogram_quantile's interpolation is known exactly.
    for op, bucket in (("put", PUT_BUCKET), ("get", GET_BUCKET)):
        assert all(bucket[0] < d < bucket[1] for d in clock.calls[op]), clock.calls[op]
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
    done = threading.Event()

    def work():  # steps keep coming while top takes its two scrapes
        i = 0
        while not done.is_set():
            run_steps(cluster, f"o{i}-", 1, Clock())
            i += 1

    worker = threading.Thread(target=work)
    worker.start()
    try:
        out = subprocess.run([sys.executable, "-m", "dpobs_otel.cli", "top", "--sd-dir",
                              str(cluster["sd"]), "--once", "--interval", "2", "--timeout", "10"],
                             capture_output=True, text=True, timeout=60,
                             env={"COLUMNS": "160", "PATH": "/usr/bin:/bin"})
    finally:
        done.set()
        worker.join()
    assert out.returncode == 0, out.stderr
    rows = {r["role"]: r for r in table(out.stdout, "Processes")}  # (a slow box: 10 s)
    assert set(rows) == {"rollout", "trainer"}
    for r in rows.values():
        assert r["state"] == "up" and 0 < float(r["frac_of_step"].rstrip("%")) <= 100, out.stdout
    ops = {r["op"]: r for r in table(out.stdout, "Ops")}
    assert set(ops) == {"put", "get"} and float(ops["get"]["p99 ms"]) > GET_SLEEP * 1e3


def test_a_prometheus_that_is_not_there_is_an_error_line_not_a_crash():
    url = f"http://127.0.0.1:{refused_port()}"
    a = PrometheusSource(url, timeout=1).answers()
    assert "unreachable" in a.error and a.jobs == [] and a.processes == []
    assert "source error" in text(a)
    out = subprocess.run([sys.executable, "-m", "dpobs_otel.cli", "top", "--prometheus", url,
                          "--once"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr + out.stdout
    assert "unreachable" in out.stdout


def test_dpobs_help_lists_every_command_on_one_line():
    from dpobs_otel.cli import COMMANDS
    out = subprocess.run([sys.executable, "-m", "dpobs_otel.cli", "--help"],
                         capture_output=True, text=True, timeout=60, env={"COLUMNS": "80"})
    lines = out.stdout.splitlines()
    for name, (_, helptext) in COMMANDS.items():
        assert any(line.split()[:1] == [name] and line.strip().endswith(helptext)
                   for line in lines), (name, out.stdout)


# -- the live view under tmux, against the demo's stack --------------------------------------
STEPS = 40
DEMO = dict(trainers=2, batch_size=32, min_len=32, max_len=256, latency_s=0.01, verify=True,
            corrupt_at=3, steps=STEPS)
TOP = [str(Path(sys.executable).with_name("dpobs")), "top", "--interval", "1"]


class Tmux:
    """A private tmux server (its own socket); each pane runs one command and keeps its last
    screen if the command exits (so a crash shows in the capture)."""

    def __init__(self):
        self.socket = f"dpobs-top-test-{os.getpid()}"
        self.env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES",
                                                                      "TMUX")}

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args],
                              check=True, capture_output=True, text=True, env=self.env,
                              timeout=30).stdout

    def start(self, name: str, argv: list[str]) -> None:
        cmd = f"{shlex.join(argv)}; echo EXITED $?; sleep 3600"
        self.tmux("new-session", "-d", "-s", name, "-x", "170", "-y", "60", cmd)

    def capture(self, name: str) -> str:
        return self.tmux("capture-pane", "-p", "-t", name)

    def frame_after(self, name: str, t: float, timeout: float = 60) -> str:
        """The first whole frame drawn from answers taken after wall-clock time t, captured
        twice alike (a capture never catches a redraw half-way)."""
        deadline = time.monotonic() + timeout
        while True:
            shown = self.capture(name)
            assert "EXITED" not in shown and "Traceback" not in shown, shown
            stamp = re.search(r"· (\d\d:\d\d:\d\d)", shown)
            if stamp and "Processes" in shown and _after(stamp[1], t):
                time.sleep(0.3)
                if self.capture(name).split("·", 3)[3:] == shown.split("·", 3)[3:]:
                    return shown
            assert time.monotonic() < deadline, shown
            time.sleep(0.3)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True,
                       timeout=30)


def _after(hms: str, t: float) -> bool:
    """A frame's HH:MM:SS stamp (local time) is a whole second later than t."""
    day = time.localtime(t)
    stamp = time.mktime(time.strptime(time.strftime("%Y-%m-%d ", day) + hms,
                                      "%Y-%m-%d %H:%M:%S"))
    return stamp >= int(t) + 1


@pytest.fixture(scope="module")
def paused_demo(tmp_path_factory):
    """The demo's workload on the demo's stack, a listed endpoint that refuses, `dpobs top
    --sd-dir` started after the warm-up (so its window is the measured steps), then the
    measured steps; then, with the workload paused (processes up, counters still),
    `dpobs top --prometheus` beside it."""
    from dpobs_otel.demo.batches import Config
    from dpobs_otel.demo.stack import Stack
    from dpobs_otel.demo.workload import Workload

    tm = Tmux()
    try:
        with Stack() as stack:
            ghost = f"127.0.0.1:{refused_port()}"
            (Path(stack.sd_dir) / "ghost.json").write_text(json.dumps(
                [{"targets": [ghost], "labels": {"job": "dpobs", "role": "ghost", "rank": "0"}}]))
            with Workload(Config(**DEMO, sd_dir=stack.sd_dir)) as wl:
                instances = [i["instance"] for i in wl.info.values()]
                wl.warmup()
                stack.wait_scraped(instances, after=time.time())
                t = time.time()
                tm.start("sd", TOP + ["--sd-dir", stack.sd_dir, "--window", "600"])
                tm.frame_after("sd", t)  # its first scrape: after the warm-up
                quiet = time.time()  # counters hold still from the warm-up's end to here
                wl.run()
                t = time.time()
                stack.wait_scraped(instances, after=t)
                stack.wait_evaluated(after=time.time())
                tm.start("prom", TOP + ["--prometheus", stack.prometheus])
                yield {"stack": stack, "ghost": ghost, "info": wl.info, "quiet": quiet,
                       "tmux": tm, "sd": tm.frame_after("sd", time.time())}
    finally:
        tm.close()


def rules(stack) -> dict:
    """The recording rules' values now, keyed as the view's rows are."""
    def by(expr: str, *labels: str) -> dict:
        return {tuple(r["metric"].get(k, "") for k in labels): r["value"]
                for r in stack.query(expr)}
    op = "job_op:dpobs_client_operation_duration_seconds"
    return {
        "frac": by("job:dpobs_frac_of_step:ratio_rate5m", "job"),
        "max": by("job:dpobs_frac_of_step:max_ratio_rate5m", "job"),
        "bytes": by("sum by (job, direction) "
                    "(job_op_direction:dpobs_client_transferred_bytes:rate5m)", "job",
                    "direction"),
        "outstanding": by("job:dpobs_client_outstanding_size_bytes:sum", "job"),
        "checked": by("job:dpobs_guard_rows_checked:increase5m", "job"),
        "mismatched": by("job:dpobs_guard_rows_mismatched:increase5m", "job"),
        "share": by("job_op:dpobs_operation_share:ratio_rate5m", "job", "op"),
        "ops": by("job_op:dpobs_client_operations:rate5m", "job", "op"),
        "mean": by(f"{op}:mean_rate5m", "job", "op"),
        "p90": by(f'{op}:quantile_rate5m{{quantile="0.9"}}', "job", "op"),
        "p99": by(f'{op}:quantile_rate5m{{quantile="0.99"}}', "job", "op"),
        "process": by("instance:dpobs_frac_of_step:ratio_rate5m", "instance"),
        "alerts": sorted({a["labels"]["alertname"] for a in stack.api("alerts")["alerts"]
                          if a["state"] == "firing"}),
    }


UNIT = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def number(cell: str) -> float:
    """A cell as a number in base units: 12.3% -> 0.123, '4.56 MB/s' -> 4.56e6."""
    if cell.endswith("%"):
        return float(cell[:-1]) / 100
    value, _, unit = cell.partition(" ")
    return float(value) * UNIT[unit.removesuffix("/s")] if unit else float(value)


def rounding(truth: float, pct: bool) -> float:
    """What a shown cell's rounding hides: 0.1 point of a percentage, else three
    significant digits (and 0.1% for float noise)."""
    return (0.0006 if pct else 0.005 * abs(truth)) + 0.001 * abs(truth)


def near(shown: str, truth: float, rel: float = 0.0, pct: bool = False) -> bool:
    """A shown cell against a value: within rel, or within its rounding."""
    return abs(number(shown) - truth) <= max(rel * abs(truth), rounding(truth, pct))


class Polls:
    """The rules' values, queried over and over while a frame is awaited. Prometheus holds
    each evaluation's value for an evaluation interval (1s), and a paused workload's values
    still move a little from one evaluation to the next (rate()'s extrapolation at the edges
    of a young window), so each cell the frame shows must be one of the polled values."""

    def __init__(self, stack):
        self.stack, self.seen, self._stop = stack, [], threading.Event()
        self._thread = threading.Thread(target=self._poll)

    def _poll(self):
        while not self._stop.is_set():
            self.seen.append(rules(self.stack))
            time.sleep(0.1)

    def __enter__(self):
        self.seen.append(rules(self.stack))
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.seen.append(rules(self.stack))

    def check(self, cell: str, key: str, labels: tuple, scale: float = 1.0,
              pct: bool = False) -> None:
        values = [scale * p[key][labels] for p in self.seen if labels in p[key]]
        assert any(near(cell, v, pct=pct) for v in values), (key, labels, cell, values)


def test_top_on_prometheus_shows_the_recording_rules(paused_demo):
    """Paused workload: every cell of the pane is one of the rule's values polled from just
    before the frame's answers were taken until just after it was captured."""
    with Polls(paused_demo["stack"]) as polls:
        shown = paused_demo["tmux"].frame_after("prom", time.time())
    check, r1 = polls.check, polls.seen[-1]
    (job,) = table(shown, "Jobs")
    check(job["frac_of_step"], "frac", ("dpobs",), pct=True)
    check(job["slowest proc"], "max", ("dpobs",), pct=True)
    check(job["read"], "bytes", ("dpobs", "read"))
    check(job["write"], "bytes", ("dpobs", "write"))
    check(job["outstanding"], "outstanding", ("dpobs",))
    check(job["guard checked"], "checked", ("dpobs",))
    assert number(job["mismatched"]) == r1["mismatched"][("dpobs",)] == 1
    ops = {row["op"]: row for row in table(shown, "Ops")}
    assert set(ops) == {op for _, op in r1["ops"]}
    for (_, op) in r1["share"]:
        row = ops[op]
        check(row["share"], "share", ("dpobs", op), pct=True)
        check(row["ops/s"], "ops", ("dpobs", op))
        for col, key in (("mean ms", "mean"), ("p90 ms", "p90"), ("p99 ms", "p99")):
            if ("dpobs", op) in r1[key]:
                check(row[col], key, ("dpobs", op), scale=1e3)
            else:  # no calls in the window: the rules have no latency, nor does the view
                assert row[col] == "-"
    procs = table(shown, "Processes")
    ranks = {i["instance"]: str(rank) for (_, rank), i in paused_demo["info"].items()}
    for row in procs[:-1]:
        assert row["state"] == "up" and row["rank"] == ranks[row["instance"]]
        check(row["frac_of_step"], "process", (row["instance"],), pct=True)
    assert [number(p["frac_of_step"]) for p in procs[:-1]] == sorted(
        (number(p["frac_of_step"]) for p in procs[:-1]), reverse=True)
    assert procs[-1]["instance"] == paused_demo["ghost"] and procs[-1]["state"].startswith("DOWN")
    assert len(procs) == len(paused_demo["info"]) + 1
    alerts = shown[shown.index("Alerts firing"):shown.index("Jobs")]
    assert r1["alerts"] == ["DpobsWireHashMismatch"] and "DpobsWireHashMismatch critical" in alerts


OP_SERIES = "dpobs_client_operation_duration_seconds"


def since(stack, metric: str, by: str, t: float) -> dict:
    """What a counter summed by `by` grew by from t to now, from Prometheus's raw samples
    (PromQL's @: no rate(), no extrapolation)."""
    expr = f"sum by ({by}) ({metric}) - sum by ({by}) ({metric} @ {t:.3f})"
    return {tuple(r["metric"].get(k, "") for k in by.split(", ")): r["value"]
            for r in stack.query(expr)}


def window_quantile(stack, op: str, q: float, t: float) -> float:
    """histogram_quantile over the buckets' increase from t to now."""
    b = f'sum by (le) ({OP_SERIES}_bucket{{op="{op}"}}'
    [r] = stack.query(f"histogram_quantile({q}, {b}) - {b} @ {t:.3f}))")
    return r["value"]


def test_top_on_file_sd_computes_the_same_answers_itself(paused_demo):
    """Its window is the measured steps: first scrape after the warm-up, last in the pause.
    Every answer equals, to its rounding, the same arithmetic done by Prometheus on its raw
    samples over that window (counters now minus at the quiet point before the measured
    steps). The rules' own 5m window also holds what the warm-up step did after
    Prometheus's first sample, and rate()'s edge extrapolation on a young window moves a
    ratio by a few percent, so against the rules ratios agree within 10%; the guard's
    counts differ by exactly the warm-up step's rows (the rules count a series born in the
    window whole; every step checks the same rows)."""
    stack, quiet = paused_demo["stack"], paused_demo["quiet"]
    shown, r = paused_demo["sd"], rules(stack)
    op_s = since(stack, f"{OP_SERIES}_sum", "op", quiet)
    calls = since(stack, f"{OP_SERIES}_count", "op", quiet)
    moved = since(stack, "dpobs_client_transferred_bytes_total", "direction", quiet)
    per_proc = since(stack, f"{OP_SERIES}_sum", "instance", quiet)
    steps = since(stack, "dpobs_step_duration_seconds_sum", "instance", quiet)
    fracs = {i: per_proc[i] / steps[i] for i in steps}

    (job,) = table(shown, "Jobs")
    assert near(job["frac_of_step"], sum(op_s.values()) / sum(steps.values()), pct=True)
    assert near(job["frac_of_step"], r["frac"][("dpobs",)], 0.10, pct=True)
    assert near(job["slowest proc"], max(fracs.values()), pct=True)
    assert number(job["guard checked"]) * (STEPS + 1) == r["checked"][("dpobs",)] * STEPS
    assert number(job["mismatched"]) == r["mismatched"][("dpobs",)] == 1
    ops = {row["op"]: row for row in table(shown, "Ops")}
    assert set(ops) == {op for (op,) in op_s}
    for direction, op in (("read", "get"), ("write", "put")):  # bytes per call: rate / rate
        assert near(str(number(job[direction]) / number(ops[op]["ops/s"])),
                    moved[(direction,)] / calls[(op,)], 0.005)
    for (op,), secs in op_s.items():
        row = ops[op]
        assert near(row["share"], secs / sum(op_s.values()), pct=True), (op, row)
        if calls[(op,)] == 0:  # register: no call after the warm-up
            assert (row["mean ms"], row["p90 ms"], row["p99 ms"]) == ("-", "-", "-")
            continue
        assert near(row["share"], r["share"][("dpobs", op)], 0.10, pct=True), (op, row)
        assert near(row["mean ms"], 1e3 * secs / calls[(op,)]), (op, row)
        for col, q in (("p90 ms", 0.9), ("p99 ms", 0.99)):
            truth = window_quantile(stack, op, q, quiet)
            assert near(row[col], 1e3 * truth), (op, col, row, truth)
    procs = table(shown, "Processes")
    for row in procs[:-1]:
        assert row["state"] == "up"
        assert near(row["frac_of_step"], fracs[(row["instance"],)], pct=True)
    assert procs[-1]["instance"] == paused_demo["ghost"]
    assert procs[-1]["state"] == "DOWN (connection refused)"
    assert "Alerts: only with --prometheus" in shown
