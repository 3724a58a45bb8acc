"""tel.cluster_step_metrics(sd_dir) against the processes' own truth.

Worker processes (dpobs_otel/testing/step_worker.py) step on command and report the sum of
their own tel.step_metrics() deltas; the driver (this process, itself one of the cluster)
does the same. Between the driver's calls every worker has finished its steps, so the cluster dict
must equal the sum of those per-step deltas over the processes alive at both calls: counts
and bytes exactly, seconds to float rounding. Then the faults: a restart on the same port,
a death mid-window, a newcomer, a listed endpoint that never answers, a clean exit.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import fakeprom
import dpobs_otel as dpobs
from dpobs_otel.readback import cluster, sources
from dpobs_otel.testing.processes import free_port
from dpobs_otel.testing.step_worker import step

WORKER = "dpobs_otel.testing.step_worker"
JOB = "dpobs-cl"
P = "dpobs/cluster/"
COUNTS = ("calls", "errors")


class Worker:
    def __init__(self, sd: Path, role: str, rank: int, port: int = 0, guard: bool = False):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DPOBS_")}
        argv = [sys.executable, "-m", WORKER, "--role", role, "--rank", str(rank),
                "--port", str(port), "--sd-dir", str(sd)] + (["--guard"] if guard else [])
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self.info = json.loads(self.proc.stdout.readline())

    def steps(self, n: int, corrupt: bool = False) -> dict:
        self.proc.stdin.write(f"steps {n}{' corrupt' if corrupt else ''}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=20)

    def exit(self) -> None:
        self.proc.stdin.write("exit\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=20)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()


class Driver:
    """This process as one of the cluster, with the same truth as a worker's."""

    def __init__(self, sd: Path):
        self.tel = dpobs.start(role="driver", rank=0, job=JOB, port=0, sd_dir=str(sd))
        self.raw = dpobs.InMemoryDataPlane()
        self.client = self.tel.instrument(self.raw)
        self.done = 0

    def steps(self, n: int) -> dict:
        total, last = {}, {}
        for _ in range(n):
            step(self.tel, self.client, self.raw, self.done, 4, False)
            self.done += 1
            last = self.tel.step_metrics()
            for k, v in last.items():
                total[k] = total.get(k, 0.0) + v
        return {"sum": total, "last": last}


def expected(reports: list[dict]) -> dict[str, float]:
    """The cluster dict's additive keys from the processes' reports, summed."""
    out: dict[str, float] = {}
    for r in reports:
        for k, v in r["sum"].items():
            if k.endswith(("/share", "_frac", "max_latency_s", "outstanding_mb", "frac_of_step")):
                continue
            out[P + k[len("dpobs/"):]] = out.get(P + k[len("dpobs/"):], 0.0) + v
    return out


CRITICAL_PATH = ("busy_s", "exposed_s")


def assert_matches(got: dict, reports: list[dict]) -> None:
    want = {k: v for k, v in expected(reports).items()
            if k[len(P):] not in CRITICAL_PATH}
    additive = {k for k in got if not k.endswith(("/share", "_frac", "frac_of_step",
                                                  "frac_of_step_max", "exposed_frac_max",
                                                  "outstanding_mb", "scrape_s"))
                and "/processes" not in k and k[len(P):] not in CRITICAL_PATH}
    assert additive == set(want), sorted(additive ^ set(want))
    assert_critical_path(got, reports)
    for k, v in want.items():
        if k.endswith("/mb"):
            assert round(got[k] * 1e6) == round(v * 1e6), k  # bytes, exactly
        elif k.endswith(COUNTS) or k.endswith("/steps") or "/guard/" in k:
            assert got[k] == v, (k, got[k], v)
        else:  # seconds: the same float sums, differenced in another order
            assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    dp = {id(r): sum(v for k, v in r["sum"].items() if k.startswith("dpobs/op/")
                     and k.endswith("/seconds")) for r in reports}
    assert got[P + "frac_of_step"] == pytest.approx(
        sum(dp.values()) / sum(r["sum"]["dpobs/step_s"] for r in reports), rel=1e-9)
    assert got[P + "frac_of_step_max"] == pytest.approx(
        max(dp[id(r)] / r["sum"]["dpobs/step_s"] for r in reports), rel=1e-9)
    for op in {k.split("/")[3] for k in want if k.startswith(P + "op/")}:
        assert got[f"{P}op/{op}/share"] == pytest.approx(
            want[f"{P}op/{op}/seconds"] / want[P + "data_plane_s"], rel=1e-9)
    assert round(got[P + "outstanding_mb"] * 1e6) == round(
        sum(r["last"]["dpobs/outstanding_mb"] for r in reports) * 1e6)


def assert_critical_path(got: dict, reports: list[dict]) -> None:
    """busy and exposed: the processes' own step_metrics sums (a process whose step_metrics
    has no such key had none: its counters were never incremented)."""
    step = {id(r): r["sum"]["dpobs/step_s"] for r in reports}
    own = {k: {id(r): r["sum"].get(f"dpobs/{k}", 0.0) for r in reports} for k in CRITICAL_PATH}
    for k in CRITICAL_PATH:
        assert got[P + k] == pytest.approx(sum(own[k].values()), rel=1e-9, abs=1e-12), k
        frac = k.replace("_s", "_frac")
        assert got[P + frac] == pytest.approx(sum(own[k].values()) / sum(step.values()),
                                              rel=1e-9, abs=1e-12), frac
    assert got[P + "exposed_frac_max"] == pytest.approx(
        max(own["exposed_s"][i] / step[i] for i in step), rel=1e-9, abs=1e-12)


def counts(got: dict) -> tuple:
    return tuple(int(got[P + k]) for k in ("processes", "processes_restarted", "processes_lost",
                                           "processes_unreachable"))


def test_cluster_dict_is_the_sum_of_each_process_own_step_deltas(sd):
    driver = Driver(sd)
    port = free_port()
    workers = {"a": Worker(sd, "trainer", 0), "b": Worker(sd, "trainer", 1, guard=True),
               "c": Worker(sd, "rollout", 0, port=port)}
    silent = socket.socket()  # listed, accepts connections, never answers
    try:
        first = driver.tel.cluster_step_metrics(str(sd), timeout=0.5)
        assert counts(first) == (4, 0, 0, 0)

        # 1: everyone steps a different amount; one row corrupted behind the guard's back
        r = [workers["a"].steps(3), workers["b"].steps(2, corrupt=True),
             workers["c"].steps(4), driver.steps(1)]
        got = driver.tel.cluster_step_metrics(str(sd), timeout=0.5)
        assert counts(got) == (4, 0, 0, 0)
        assert_matches(got, r)
        # both reads of the step fetch the rewritten row's obs
        assert got[P + "guard/rows_mismatched"] == 2 and got[P + "steps"] == 10

        # 2: the rollout restarts on the same port mid-window: it counts from its restart
        workers["c"].steps(2)
        workers["c"].kill()
        workers["c"] = Worker(sd, "rollout", 0, port=port)
        r = [workers["c"].steps(3), workers["a"].steps(1), workers["b"].steps(1),
             driver.steps(1)]
        got = driver.tel.cluster_step_metrics(str(sd), timeout=0.5)
        assert counts(got) == (4, 1, 0, 0)
        assert_matches(got, r)

        # 3: trainer 0 dies mid-window (left out), a newcomer counts from its start, and a
        # listed endpoint never answers
        workers["a"].steps(2)
        workers["a"].kill()
        workers["d"] = Worker(sd, "trainer", 2)
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        (sd / "silent.json").write_text(json.dumps(
            [{"targets": ["127.0.0.1:%d" % silent.getsockname()[1]],
              "labels": {"job": JOB, "role": "stuck", "rank": "0"}}]))
        r = [workers["d"].steps(2), workers["b"].steps(1), workers["c"].steps(1),
             driver.steps(2)]
        got = driver.tel.cluster_step_metrics(str(sd), timeout=0.5)
        assert counts(got) == (4, 0, 1, 1)
        assert_matches(got, r)
        assert P + "guard/rows_checked" in got

        # 4: the guarded process exits cleanly: lost, and with it the guard keys (absent,
        # not zero, when no summed process ran the guard)
        workers["b"].exit()
        r = [workers["c"].steps(1), workers["d"].steps(1), driver.steps(1)]
        got = driver.tel.cluster_step_metrics(str(sd), timeout=0.5)
        assert counts(got) == (3, 0, 1, 1)
        assert_matches(got, r)
        assert not [k for k in got if "/guard/" in k]
    finally:
        silent.close()
        for w in workers.values():
            w.close()
        driver.tel.shutdown()


def test_breakdown_rows_worst_first_with_bucket_bounded_max():
    inf = float("inf")
    slow = scrape_totals({"get": (2, 0.004, {0.001: 0, 0.0025: 1, 0.005: 2, inf: 2}),
                          "put": (1, 0.02, {0.01: 0, 0.025: 1, inf: 1})})
    fast = scrape_totals({"get": (3, 0.003, {0.001: 3, 0.0025: 3, 0.005: 3, inf: 3}),
                          "put": (0, 0.0, {0.01: 0, 0.025: 0, inf: 0}),
                          "list": (1, 40.0, {30.0: 0, inf: 1})})
    w = cluster.Window({("j", "", "h:1", "trainer", "0"): (
        {"role": "trainer", "rank": "0"}, slow), ("j", "", "h:2", "rollout", "5"): (
        {"role": "rollout", "rank": "5"}, fast)})
    columns, rows = cluster.breakdown(w)
    assert columns == list(cluster.COLUMNS)
    by = {r[0]: dict(zip(columns, r)) for r in rows}
    assert [r[0] for r in rows] == ["list", "put", "get"]  # most seconds first
    assert by["get"]["calls"] == 5 and by["get"]["mean_ms"] == pytest.approx(1.4)
    assert by["get"]["max_ms"] == 5.0  # the slowest get fell in (2.5 ms, 5 ms]
    assert (by["get"]["slowest_role"], by["get"]["slowest_rank"]) == ("trainer", "0")
    assert by["get"]["slowest_mean_ms"] == pytest.approx(2.0)
    assert by["put"]["max_ms"] == 25.0 and by["put"]["slowest_role"] == "trainer"
    assert by["list"]["max_ms"] is None  # slower than the last finite bound: unknown
    assert sum(r[5] for r in rows) == pytest.approx(1.0)
    assert by["get"]["share"] == pytest.approx(0.007 / 40.027)


def scrape_totals(ops: dict) -> "cluster.ProcessTotals":
    from dpobs_otel.readback.scrape import OpTotals, ProcessTotals
    return ProcessTotals(ops={op: OpTotals(calls=c, seconds=s, buckets=dict(bk))
                              for op, (c, s, bk) in ops.items()}, steps=1, step_seconds=50.0)


def test_never_raises_into_the_step(sd, monkeypatch):
    driver = Driver(sd)
    try:
        driver.steps(1)
        got = driver.tel.cluster_step_metrics(str(sd))
        cols, rows = driver.tel.cluster_breakdown(str(sd))
        calls = {r[0]: r[1] for r in rows}
        assert calls == {op: got[f"{P}op/{op}/calls"] for op in calls} and len(calls) == 4
        assert driver.tel.cluster_step_metrics(str(sd / "nowhere"))[P + "processes"] == 0

        def broken(self):
            raise RuntimeError("boom")
        monkeypatch.setattr(sources.FileSDSource, "read", broken)
        assert driver.tel.cluster_step_metrics(str(sd)) == {}
        assert driver.tel.stats.instr_errors["cluster"] == 1
    finally:
        driver.tel.shutdown()


class FakePrometheus(fakeprom.QueryAPI):
    """Answers the three instant queries PrometheusSource makes from `state`:
    {instance: (up, sample timestamp, instance id, steps)}."""
    state: dict = {}

    def vector(self, q):
        result = []
        for inst, (up, ts, iid, steps) in self.state.items():
            m = {"job": JOB, "instance": inst, "role": "w", "rank": "0"}
            if q.startswith("timestamp(up"):
                result.append({"metric": m, "value": [ts + 1, str(ts)]})
            elif q.startswith("up{"):
                result.append({"metric": dict(m, __name__="up"), "value": [ts, str(up)]})
            elif up:
                result += [{"metric": dict(m, __name__="dpobs_step_duration_seconds_count"),
                            "value": [ts, str(steps)]},
                           {"metric": dict(m, __name__="target_info", service_instance_id=iid),
                            "value": [ts, "1"]}]
        return result


def test_prometheus_source_restarts_unreachable_lost_and_staleness():
    st = FakePrometheus.state
    with fakeprom.serving(FakePrometheus) as url:
        view = cluster.ClusterView(url, JOB)
        now = time.time()
        st.update({"a:1": (1, now - 30, "one", 3), "b:1": (0, now - 1, "x", 0)})
        got = view.step_metrics()
        assert counts(got) == (1, 0, 0, 1) and got[P + "steps"] == 3
        assert got[P + "staleness_s"] >= 30  # a's newest sample is 30 s old
        st.update({"a:1": (1, now, "two", 1), "b:1": (1, now, "x", 2)})
        got = view.step_metrics()  # a restarted (new instance id); b back: a new baseline
        assert counts(got) == (1, 1, 0, 0) and got[P + "steps"] == 1
        del st["a:1"]
        st["b:1"] = (1, now, "x", 5)
        got = view.step_metrics()
        assert counts(got) == (1, 0, 1, 0) and got[P + "steps"] == 3


def test_demo_reports_the_cluster_view_of_its_measured_steps(sd):
    from dpobs_otel.demo.batches import Config
    from dpobs_otel.demo.report import merge, report, session

    cfg = Config(steps=4, trainers=2, batch_size=8, min_len=8, max_len=32, latency_s=0.001,
                 sd_dir=str(sd), verify=True, corrupt_at=2)
    with session(cfg) as res:
        text = report(res, None, cfg)
    got, (columns, rows) = res.cluster
    measured = merge(res.truth.values())
    assert got[P + "processes"] == len(res.info) == 4
    assert got[P + "steps"] == measured["steps"]
    for op, d in measured["ops"].items():
        assert got[f"{P}op/{op}/calls"] == len(d), op
        assert got[f"{P}op/{op}/seconds"] == pytest.approx(d.total, rel=0.05), op
        moved = sum(v for (o, _), v in measured["bytes"].items() if o == op)
        assert round(got[f"{P}op/{op}/mb"] * 1e6) == moved, op
    # the corrupted row (a measured step: the warm-up had none), as each process exports it
    mismatched = sum(v for k in res.scraped for n, _, v in res.scraped[k]
                     if n == "dpobs_guard_rows_mismatched_total")
    assert got[P + "guard/rows_mismatched"] == mismatched >= 1
    assert "Cluster view" in text and all(f"  {r[0]:>10}" in text for r in rows)


def test_demo_logs_a_cluster_dict_every_step(sd):
    import io
    import json

    from dpobs_otel.demo.batches import Config
    from dpobs_otel.demo.report import merge, session

    cfg = Config(steps=5, trainers=2, batch_size=8, min_len=8, max_len=32, latency_s=0.001,
                 sd_dir=str(sd))
    log = io.StringIO()
    with session(cfg, cluster_log=log) as res:
        pass
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [d["step"] for d in lines] == list(range(1, cfg.steps + 1))
    # Each line is one step's window; together they are the measured steps, exactly.
    measured = merge(res.truth.values())
    for op, d in measured["ops"].items():
        assert sum(x.get(f"{P}op/{op}/calls", 0) for x in lines) == len(d), op
    assert all(x[P + "processes"] == 4 for x in lines)


def test_ray_data_time_joins_the_data_plane_and_only_stepping_processes_make_a_fraction():
    """A verl-shaped window: the driver steps (10 s), waits 9 s in a get whose data part is
    0.2 s, and puts for 0.1 s; a worker without steps reads its arguments (0.3 s of data) and
    gets from TransferQueue (2 s). data_plane_s holds every process's data seconds; the
    fraction of step holds only the driver's (0.3 / 10), never the worker's."""
    from dpobs_otel.readback.scrape import OpTotals, ProcessTotals
    driver = ProcessTotals(ray_ops={"ray_get": OpTotals(calls=1, seconds=9.2),
                                    "ray_put": OpTotals(calls=1, seconds=0.1)},
                           ray_data={"ray_get": 0.2, "ray_put": 0.1}, steps=1,
                           step_seconds=10.0)
    worker = ProcessTotals(ops={"get": OpTotals(calls=4, seconds=2.0)},
                           ray_ops={"ray_args": OpTotals(calls=1, seconds=0.3)},
                           ray_data={"ray_args": 0.3})
    w = cluster.Window({("j", "", "h:1", "driver", "0"): ({"role": "driver"}, driver),
                        ("j", "", "h:2", "worker", "0"): ({"role": "worker"}, worker)})
    got = cluster.metrics(w)
    p = cluster.PREFIX
    assert got[p + "data_plane_s"] == pytest.approx(2.6)
    assert got[p + "frac_of_step"] == pytest.approx(0.03)
    assert got[p + "frac_of_step_max"] == pytest.approx(0.03)
    assert got[p + "ray/ray_get/seconds"] == pytest.approx(9.2)  # the whole get, apart
    assert got[p + "ray/ray_get/data_s"] == pytest.approx(0.2)
    assert got[p + "ray/ray_get/share"] == pytest.approx(0.2 / 2.6)
    assert got[p + "ray/ray_args/data_s"] == pytest.approx(0.3)
    assert got[p + "op/get/share"] == pytest.approx(2.0 / 2.6)
