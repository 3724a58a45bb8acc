"""`dpobs demo --backend transferqueue --store-metrics [--unmeasured rollout]`: TransferQueue's
own exporter announced by the measured processes and scraped beside them; with every client
measured, coverage 1 within 2% per op and for the job; with the rollout unmeasured, the job's
coverage within 5% of the workload's own count of who called, put at 0, and
DpobsUnmeasuredClients delivered to Alertmanager through the demo's Prometheus."""
from __future__ import annotations

import argparse
import importlib.util

import pytest

from dpobs_otel import names as nm
from dpobs_otel.demo import command
from dpobs_otel.demo import report as demo
from dpobs_otel.demo import store_report
from dpobs_otel.demo.batches import Config
from dpobs_otel.demo.truth import Durations
from dpobs_otel.testing.stack import Stack, binaries
from helpers.dashboards import ALL, STORE, dashboard_exprs, substitute

SECONDS = 40  # measured: the rules' rates then hold a run at least 40 scrapes long
CFG = Config(trainers=2, batch_size=16, min_len=8, max_len=64, latency_s=0.0,
             backend="transferqueue", store_metrics=True, duration=SECONDS)
live = pytest.mark.skipif(
    importlib.util.find_spec("transfer_queue") is None or None in binaries().values(),
    reason="needs transferqueue and prometheus/alertmanager")


@pytest.mark.parametrize("argv, error", [
    (["--store-metrics"], "needs --backend transferqueue"),
    (["--backend", "transferqueue", "--unmeasured", "rollout"], "needs --store-metrics"),
])
def test_the_store_flags_are_checked(argv, error):
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    with pytest.raises(SystemExit, match=error):
        demo.config(p.parse_args(argv))


def test_a_transferqueue_without_its_exporter_is_a_clear_error(monkeypatch):
    """0.1.6 (ROLL's pin) has no exporter: --store-metrics says so before starting anything."""
    if importlib.util.find_spec("transfer_queue") is None:
        pytest.skip("needs transferqueue (the backend check comes first)")
    monkeypatch.setattr(store_report, "installed_release", lambda: (0, 1, 6))
    p = argparse.ArgumentParser()
    command.add_arguments(p)
    with pytest.raises(SystemExit, match=r"needs TransferQueue >= 0\.1\.7"):
        demo.config(p.parse_args(["--backend", "transferqueue", "--store-metrics"]))


def _calls(**ops) -> dict:
    out = {}
    for op, n in ops.items():
        d = out[op] = Durations()
        for _ in range(n):
            d.add(0.001)
    return {"ops": out}


def test_the_workloads_own_coverage_counts_who_called():
    truth = {("rollout", 0): _calls(put=20), ("trainer", 0): _calls(get=40),
             ("trainer", 1): _calls(get_data=40), ("driver", 0): _calls(clear=10, list=10)}
    per_op, job = store_report.coverage_truth(truth, "rollout")
    assert per_op == {"put": 0.0, "get": 1.0, "clear": 1.0}  # list is not covered
    assert job == pytest.approx(90 / 110)
    per_op, job = store_report.coverage_truth(truth, None)
    assert set(per_op.values()) == {1.0} and job == 1.0


def _run(cfg: Config):
    with Stack(mixin=store_report.stack_mixin(cfg, None)) as stack:
        cfg.sd_dir = stack.sd_dir
        with demo.session(cfg, stack) as res:
            assert store_report.instances(cfg), "no tq-controller target announced"
            per_op = {r["metric"]["op"]: r["value"]
                      for r in stack.query(nm.JOB_OP_STORE_COVERAGE)}
            [job] = stack.query(nm.JOB_STORE_COVERAGE)
            shares = {r["metric"]["op"]: r["value"]
                      for r in stack.query(nm.JOB_OP_STORE_SERVER_SHARE)}
            alerts = stack.wait_alerts(cfg.faults_alert())
            text = demo.report(res, stack, cfg)
            empty = [(where, q) for where, expr in dashboard_exprs() if STORE.search(expr)
                     for q in (substitute(expr, ALL), substitute(expr, {**ALL, "job": "dpobs"}))
                     if not stack.query(q)]
    return res, per_op, job["value"], shares, alerts, text, empty


@live
def test_with_every_client_measured_coverage_is_1():
    res, per_op, job, shares, alerts, text, empty = _run(Config(**CFG.__dict__))
    truth_op, truth_job = store_report.coverage_truth(res.truth, None)
    assert truth_job == 1.0 and set(per_op) == {"put", "get", "clear"}
    for op, c in per_op.items():
        assert c == pytest.approx(1.0, abs=0.02), (op, per_op)
    assert job == pytest.approx(1.0, abs=0.02)
    # every op the workload makes has the store's seconds beside its own, a part of them
    assert {"put", "get", "clear", "list"} <= set(shares)
    assert all(0 < s < 1 for s in shares.values()), shares
    assert nm.ALERT_UNMEASURED_CLIENTS not in {a["labels"]["alertname"] for a in alerts}
    assert "The store's own account" in text and "Coverage (every process measured)" in text
    assert not empty, empty  # every query of the dashboard's store row has data


@live
def test_with_the_rollout_unmeasured_coverage_falls_by_its_share_and_the_alert_fires():
    cfg = Config(**{**CFG.__dict__, "unmeasured": "rollout"})
    res, per_op, job, _, alerts, text, _ = _run(cfg)
    truth_op, truth_job = store_report.coverage_truth(res.truth, "rollout")
    assert truth_op["put"] == 0.0 and 0.5 < truth_job < 0.9  # the rollout made every put
    assert per_op["put"] == 0.0
    assert job == pytest.approx(truth_job, rel=0.05)
    fired = [a for a in alerts if a["labels"]["alertname"] == nm.ALERT_UNMEASURED_CLIENTS]
    assert {a["labels"]["op"] for a in fired} == {"put"}, alerts
    assert fired[0]["labels"]["severity"] == "warning"
    assert "Coverage (the rollout unmeasured)" in text
    # dpobs's own numbers are the measured processes': no put measured anywhere
    assert not any(s[2] for k in res.scraped for s in res.scraped[k]
                   if s[0] == f"{nm.OP_DURATION_SERIES}_count" and s[1].get("op") == "put")
