"""`dpobs top` live, under tmux, against the demo's stack (a real Prometheus with the mixin's
rules, Alertmanager, the demo's GRPO processes, one listed endpoint that refuses): the
pane is captured (`tmux capture-pane -p`) and compared, with the workload paused, with the
recording rules queried from the same Prometheus (--prometheus) and with Prometheus's own
arithmetic on raw samples over top's window (--sd-dir). Missing binaries (tmux,
prometheus, alertmanager) fail these tests: they are the point."""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.top import Tmux, number, refused_port, table

from dpobs_otel.names import JOB_OP_NATIVE_QUANTILE

# In the serial pass (Makefile, `alone`): top's window and Prometheus's are two observers
# of the same steps, and each answer must match to its rounding. Beside three workers in
# 6a3e7e7's fresh-clone CI the get's share showed 67.5% against Prometheus's 67.2% (about
# one get of 37 ms on one side of an edge and not the other); every earlier run had passed.
pytestmark = [pytest.mark.slow, pytest.mark.alone]

STEPS = 40
DEMO = dict(trainers=2, batch_size=32, min_len=32, max_len=256, latency_s=0.01, verify=True,
            corrupt_at=3, steps=STEPS)
TOP = [str(Path(sys.executable).with_name("dpobs")), "top", "--interval", "1"]


@pytest.fixture(scope="module")
def paused_demo(tmp_path_factory):
    """The demo's workload on the demo's stack, a listed endpoint that refuses, `dpobs top
    --sd-dir` started after the warm-up (so its window is the measured steps), then the
    measured steps; then, with the workload paused (processes up, counters still),
    `dpobs top --prometheus` beside it."""
    from dpobs_otel.demo.batches import Config
    from dpobs_otel.testing.stack import Stack
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
        # the stack's Prometheus has native histograms on: top shows the native quantiles
        "p90": by(f'{JOB_OP_NATIVE_QUANTILE}{{quantile="0.9"}}', "job", "op"),
        "p99": by(f'{JOB_OP_NATIVE_QUANTILE}{{quantile="0.99"}}', "job", "op"),
        "process": by("instance:dpobs_frac_of_step:ratio_rate5m", "instance"),
        "alerts": sorted({a["labels"]["alertname"] for a in stack.api("alerts")["alerts"]
                          if a["state"] == "firing"}),
    }


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
                assert row["from"] == "native", row
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
