"""End to end: the demo's processes scraped through file_sd by a real Prometheus running the
deploy/ rules, alerting through a real Alertmanager; every answer checked over the HTTP APIs
against the workload's own truth. Missing binaries fail these tests: they are the point."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from dpobs_otel.demo.report import frac_of_step, merge, op_shares, session
from helpers.dashboards import ALL, STORE, dashboard_exprs, ray_row_exprs, substitute
from dpobs_otel.testing.stack import Stack
from dpobs_otel.demo.batches import Config

pytestmark = pytest.mark.slow

REL = 0.05  # recording rules within 5% (relative) of the truth
# A steady 10 ms per call keeps step time stable; 40 s of measured steps keeps rate()'s
# extrapolation at the window edges (at most one scrape interval per target) near 1%.
# Every opt-in feature on (the guard, row age, a weight sync), so that every dashboard
# panel has data.
WORKLOAD = dict(trainers=2, batch_size=32, min_len=32, max_len=256, latency_s=0.01,
                verify=True, row_age=True, weight_sync="gloo")
MEASURE_S = 40


@pytest.fixture(scope="module")
def clean():
    with Stack() as stack:
        cfg = Config(**WORKLOAD, duration=MEASURE_S, sd_dir=stack.sd_dir)
        with session(cfg, stack) as res:
            yield stack, res


def close(value: float, truth: float, rel: float = REL) -> bool:
    return abs(value - truth) <= rel * abs(truth)


def by(results: list[dict], *labels: str) -> dict:
    return {tuple(r["metric"].get(lab) for lab in labels): r["value"] for r in results}


def test_every_process_is_an_up_file_sd_target_with_its_role(clean):
    stack, res = clean
    targets = {t["labels"]["instance"]: t for t in stack.targets()}
    for (role, rank), info in res.info.items():
        t = targets.get(info["instance"])
        assert t is not None, f"{role} {rank} ({info['instance']}) not discovered"
        assert t["health"] == "up", t
        assert t["discoveredLabels"]["__meta_filepath"].startswith(stack.sd_dir)
        assert (t["labels"]["job"], t["labels"]["role"], t["labels"]["rank"]) == \
            ("dpobs", role, str(rank))
    up = by(stack.query('up{job="dpobs"}'), "instance", "role")
    assert up == {(i["instance"], role): 1.0 for (role, _), i in res.info.items()}


def test_frac_of_step_matches_the_truth(clean):
    stack, res = clean
    truth = frac_of_step(merge(res.truth.values()))
    [job] = stack.query('job:dpobs_frac_of_step:ratio_rate5m{job="dpobs"}')
    assert close(job["value"], truth), (job["value"], truth)
    per = by(stack.query("instance:dpobs_frac_of_step:ratio_rate5m"), "instance", "role")
    assert len(per) == len(res.info)
    for (role, rank), info in res.info.items():
        got, want = per[(info["instance"], role)], frac_of_step(res.truth[(role, rank)])
        assert close(got, want), (role, rank, got, want)


def test_op_shares_sum_to_one_and_match_the_truth(clean):
    stack, res = clean
    shares = by(stack.query('job_op:dpobs_operation_share:ratio_rate5m{job="dpobs"}'), "op")
    assert abs(sum(shares.values()) - 1) <= 0.01, shares
    truth = op_shares(merge(res.truth.values()))
    assert {op for (op,) in shares} >= truth.keys()
    for (op,), got in shares.items():  # register ran in the warm-up only: share 0 both ways
        assert close(got, truth.get(op, 0.0)), (op, got, truth.get(op))


def test_bytes_by_op_and_direction_match_what_the_workload_moved(clean):
    stack, res = clean
    # The raw counters hold every byte ever moved: equal to the truth, exactly.
    everything = merge(merge([res.warm[k], res.truth[k]]) for k in res.info)
    raw = by(stack.query('sum by (op, direction) (dpobs_client_transferred_bytes_total'
                         '{job="dpobs"})'), "op", "direction")
    assert raw == {k: float(v) for k, v in everything["bytes"].items()}
    # The recording rule's rate, per operation (the ops rate shares its window and
    # extrapolation), is the bytes per call the measured steps moved.
    measured = merge(res.truth.values())
    per_call = by(stack.query(
        "job_op_direction:dpobs_client_transferred_bytes:rate5m"
        " / ignoring(direction) group_left job_op:dpobs_client_operations:rate5m"), "op",
        "direction")
    assert per_call.keys() == measured["bytes"].keys()
    for (op, direction), n in measured["bytes"].items():
        want = n / len(measured["ops"][op])
        assert close(per_call[(op, direction)], want, 0.02), (op, per_call, want)


def test_no_alert_fires_in_a_clean_run(clean):
    stack, _ = clean
    assert stack.alerts() == []
    firing = [a for a in stack.api("alerts")["alerts"] if a["state"] == "firing"]
    assert firing == []


# -- dashboards ----------------------------------------------------------------------------
def test_every_dashboard_expression_returns_data(clean):
    stack, res = clean
    trainer = res.info[("trainer", 0)]["instance"]
    choices = [ALL, {"job": "dpobs", "node": ".*", "role": "trainer", "instance": trainer}]
    # The store's own account needs a store exporter scraped: the store-metrics demo's test
    # asks for those (tests/demo/test_store_metrics.py); the Ray rows a Ray job, which
    # tests/adapters/ray/test_ray_store_alerts.py runs.
    ray = set(ray_row_exprs())
    exprs = [(where, e) for where, e in dashboard_exprs()
             if not STORE.search(e) and (where, e) not in ray]
    assert exprs
    for where, expr in exprs:
        for values in choices:
            q = substitute(expr, values)
            assert stack.query(q), f"{where}: no data for {q}"


# -- a corrupted row -----------------------------------------------------------------------
def test_a_corrupted_row_pages_through_alertmanager():
    with Stack() as stack:
        cfg = Config(**WORKLOAD, duration=5, corrupt_at=3, sd_dir=stack.sd_dir)
        with session(cfg, stack):
            deadline = time.monotonic() + 30
            while not (alerts := [a for a in stack.alerts()
                                  if a["labels"]["alertname"] == "DpobsWireHashMismatch"]):
                assert time.monotonic() < deadline, stack.api("alerts")
                time.sleep(0.5)
            assert {a["labels"]["severity"] for a in alerts} == {"critical"}
            assert {a["labels"]["role"] for a in alerts} == {"trainer"}
            [mismatched] = stack.query("sum(dpobs_guard_rows_mismatched_total)")
            assert mismatched["value"] == 1


# -- the command, stopped with Ctrl-C ------------------------------------------------------
def test_dpobs_demo_stops_everything_on_ctrl_c():
    """`dpobs demo` as `make demo` runs it: on Ctrl-C (SIGINT to its process group, as a
    terminal sends it) it finishes the step, reports, and leaves no process or directory."""
    dpobs = Path(sys.executable).with_name("dpobs")
    proc = subprocess.Popen(
        [dpobs, "demo", "--duration", "0", "--batch-size", "8", "--max-len", "64"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 180
        while not any("measuring" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=5)
    out = "".join(lines)
    assert "Prometheus recording rules" in out and "Alertmanager: no alerts" in out, out
    urls = re.findall(r"^(?:Prometheus|Alertmanager) +(http://\S+)", out, re.M)
    pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", out)]
    sd_dir = re.search(r"^file_sd +(\S+)", out, re.M).group(1)
    assert len(urls) == 2 and pids
    assert not Path(sd_dir).parent.exists()
    for url in urls:
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{url}/-/ready", timeout=2)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or \
            Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", pid
