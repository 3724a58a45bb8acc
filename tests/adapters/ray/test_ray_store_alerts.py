"""End to end (issue 44, item 7): Ray drivers on a 100 MiB object store, measured by dpobs and
discovered with their Ray node (adapters/ray/nodes.py) by a real Prometheus running the
shipped rules, alerting through a real Alertmanager (testing/stack.py), loopback only. A run
that overflows the store spills and DpobsRayObjectStoreSpilling reaches Alertmanager; a run
that fits stays silent; a put refused for want of room raises DpobsRayObjectStoreFull; every
query of the dashboards' Ray rows has data against the spilling run.

Each run is its own driver and Ray (helpers/ray_store_job.py) under its own job label, one
after another; the alerts' `for:` knobs are short (a mixin Config of the stack's own), and
every wait polls for its condition."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

from dpobs_otel import names
from dpobs_otel.mixin import DEFAULT
from dpobs_otel.readback.sources import PrometheusSource
from dpobs_otel.testing.stack import Stack
from dpobs_otel.testing.transferqueue import LOOPBACK_ENV
from helpers.dashboards import ALL, ray_row_exprs, substitute
from helpers.ray_runs import TESTS

pytestmark = pytest.mark.slow

SPILLING_FOR_S, FULL_FOR_S = 2, 5
KNOBS = dataclasses.replace(DEFAULT, ray_spilling_for=f"{SPILLING_FOR_S}s",
                            ray_store_full_for=f"{FULL_FOR_S}s")
SPILLING, FULL = names.ALERT_RAY_STORE_SPILLING, names.ALERT_RAY_STORE_FULL
WAIT_S = 45  # the longest any condition is polled for


@pytest.fixture(scope="module")
def stack():
    with Stack(mixin=KNOBS) as st:
        yield st


class Driver:
    """helpers/ray_store_job.py in a subprocess: its events as they come, stopped on exit."""

    def __init__(self, stack, mode: str, job: str):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DPOBS_", "OTEL_"))}
        env.update(LOOPBACK_ENV, PYTHONPATH=str(TESTS), RAYSTORE_MODE=mode, DPOBS_JOB=job,
                   DPOBS_SD_DIR=stack.sd_dir)
        self.job, self.events = job, []
        self.proc = subprocess.Popen([sys.executable, "-m", "helpers.ray_store_job"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()
        self.err: list[str] = []
        threading.Thread(target=lambda: self.err.extend(self.proc.stderr), daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def event(self, key: str, timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e[key] for e in self.events if key in e]
            if found:
                return found[0]
            assert self.proc.poll() is None, "".join(self.err)[-3000:]
            time.sleep(0.1)
        raise AssertionError(f"no {key} from the driver:\n{''.join(self.err)[-3000:]}")

    def stop(self) -> dict:
        self.proc.stdin.close()
        truth = self.event("truth", timeout=60)
        self.proc.wait(timeout=60)
        return truth


@contextmanager
def driving(stack, mode: str, job: str):
    driver = Driver(stack, mode, job)
    try:
        driver.ready = driver.event("ready")
        yield driver
    finally:
        if driver.proc.poll() is None:
            try:
                driver.stop()
            except Exception:
                os.killpg(driver.proc.pid, 9)
                driver.proc.wait(timeout=30)


def until(fn, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}"
        time.sleep(0.25)


def managed(stack, alertname: str, job: str) -> list[dict]:
    """The alerts named so for the job that Alertmanager holds."""
    return [a for a in stack.alerts()
            if a["labels"]["alertname"] == alertname and a["labels"].get("job") == job]


def ever(stack, job: str) -> list[dict]:
    """Every Ray store alert of the job Prometheus has had pending or firing in the last 5m."""
    return stack.query(f'count_over_time(ALERTS{{alertname=~"{SPILLING}|{FULL}", '
                       f'job="{job}"}}[5m])')


def one(stack, expr: str) -> float:
    [r] = stack.query(expr)
    return r["value"]


# -- the runs ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fitting(stack):
    """A run whose batches fit, held until the rules have judged it for longer than the spill
    alert's `for:`, with Ray ops running all along."""
    job = "ray-fit"
    with driving(stack, "fit", job) as driver:
        until(lambda: stack.query(f'{names.JOB_NODE_RAY_STORE_USED}{{job="{job}"}}')
              and stack.query(f'{names.JOB_OP_METHOD_SECONDS}{{job="{job}"}} > 0'),
              "the fitting run's node and Ray ops in the rules")
        stack.wait_evaluated(time.time() + SPILLING_FOR_S + 3, timeout=WAIT_S)
        seen = {"ever": ever(stack, job),
                "used_max": one(stack, f'max_over_time({names.JOB_NODE_RAY_STORE_USED}'
                                       f'{{job="{job}"}}[5m])'),
                "spilled": stack.query(f'{names.RAY_NODE_SPILLED_OBJECTS}{{job="{job}", '
                                       f'{names.RAY_SPILLED_OBJECTS_MATCHER}}}'),
                "targets": [t for t in stack.targets() if t["labels"].get("job") == job],
                "processes": PrometheusSource(stack.prometheus, job).read().processes,
                "managed": [a for a in stack.alerts() if a["labels"].get("job") == job]}
        truth = driver.stop()
    return driver, seen, truth


@pytest.fixture(scope="module")
def spilling(stack):
    """A run holding more than twice the store, until its spill alert reaches Alertmanager;
    the dashboards' Ray rows asked for data while it runs."""
    job = "ray-spill"
    with driving(stack, "spill", job) as driver:
        alerts = until(lambda: managed(stack, SPILLING, job), f"{SPILLING} in Alertmanager")
        raised = {(r["metric"].get("method"), r["metric"]["error_type"]): r["value"]
                  for r in stack.query(f'{names.OP_ERRORS_SERIES}{{job="{job}", '
                                       f'op="{names.RAY_GET}"}}')}
        spilled = one(stack, f'sum({names.RAY_NODE_SPILLED_OBJECTS}{{job="{job}", '
                             f'{names.RAY_SPILLED_OBJECTS_MATCHER}}})')
        # Grafana's All, then this job's driver as the process dashboard picks one
        driver_only = {**ALL, "job": job, "role": "driver", "instance": driver.ready["instance"]}
        rows = {(where, q): stack.query(q) for where, expr in ray_row_exprs()
                for q in {substitute(expr, ALL), substitute(expr, driver_only)}}
        truth = driver.stop()
    return driver, alerts, spilled, rows, raised, truth


# -- Ray's node, discovered ------------------------------------------------------------------
def test_the_ray_node_is_an_up_target_labelled_with_its_node(fitting):
    driver, seen, _ = fitting
    node = [t for t in seen["targets"] if t["labels"]["role"] == names.ROLE_RAY_NODE]
    assert len(node) == 1, seen["targets"]
    assert node[0]["health"] == "up"
    assert node[0]["labels"]["node"] == driver.ready["node"]
    assert node[0]["labels"][names.SOURCE_LABEL] == names.SOURCE_RAY


def test_the_cluster_view_counts_the_processes_not_the_node(fitting):
    """The node serves no dpobs series: read as a process it would be one that is down."""
    _, seen, _ = fitting
    roles = sorted(s.labels["role"] for s in seen["processes"].values())
    assert roles == ["Scorer", "driver"]
    assert all(s.totals is not None for s in seen["processes"].values())


# -- spilling --------------------------------------------------------------------------------
def test_a_run_that_fits_stays_silent(fitting):
    _, seen, truth = fitting
    assert truth["steps"] > 0 and not truth["errors"]
    assert seen["ever"] == [] and seen["managed"] == []
    # Judged on data: the store's use was recorded, below the full alert's knob, and Ray
    # spilled nothing (its spill counter is born at its first spill, or reads 0).
    assert 0 < seen["used_max"] < KNOBS.ray_store_full_frac
    assert all(r["value"] == 0 for r in seen["spilled"])


def test_a_run_that_overflows_the_store_spills_and_pages(spilling):
    driver, alerts, spilled, _, _, truth = spilling
    assert spilled > 0  # Ray's own count
    [alert] = alerts
    assert alert["labels"]["node"] == driver.ready["node"]
    assert alert["labels"]["severity"] == "warning"
    assert alert["annotations"]["runbook_url"].endswith("#" + SPILLING.lower())
    assert truth["steps"] > 0 and not truth["errors"]


def test_a_method_that_raises_counts_on_the_getter_by_method_and_class(spilling):
    *_, raised, truth = spilling
    assert truth["raised"] == "RayTaskError(ValueError)"
    assert raised == {("Scorer.boom", truth["raised"]): 1.0}


# Panels of bytes that crossed nodes: a one-node run has none to show (the two-node demo's
# test, tests/demo/test_ray_demo.py, reads their records against Ray's locations)
BETWEEN_NODES = (names.JOB_FROM_NODE_NODE_RAY_REMOTE, names.JOB_NODE_RAY_FETCH_BANDWIDTH)


def test_every_query_of_the_ray_rows_has_data_against_the_live_run(spilling):
    *_, rows, _, _ = spilling
    assert rows, "no Ray row in dashboards/*.json"
    empty = sorted(where_q for where_q, result in rows.items() if not result)
    one_node = [(w, q) for w, q in empty if any(r in q for r in BETWEEN_NODES)]
    assert one_node and len(one_node) < len(rows)
    empty = [e for e in empty if e not in one_node]
    assert empty == [], "no data:\n" + "\n".join(f"{w}: {q}" for w, q in empty)


# -- a full store ----------------------------------------------------------------------------
def test_a_put_refused_for_want_of_room_pages_as_a_full_store(stack):
    job = "ray-full"
    with driving(stack, "full", job) as driver:
        refused = driver.ready["errors"]
        # Ray 2.60 raises OutOfDiskError where it can neither spill nor fall back on disk;
        # older ones ObjectStoreFullError: either is the refusal the alert reads.
        assert sum(refused.values()) == 1 and set(refused) <= set(names.RAY_STORE_FULL_ERRORS)
        [alert] = until(lambda: managed(stack, FULL, job), f"{FULL} in Alertmanager")
        counted = {r["metric"]["error_type"]: r["value"] for r in stack.query(
            f'sum by (error_type) ({names.OP_ERRORS_SERIES}{{job="{job}", '
            f'op="{names.RAY_PUT}"}})')}
        used = f'max_over_time({names.JOB_NODE_RAY_STORE_USED}{{job="{job}"}}[5m])'
        [used_max] = until(lambda: stack.query(used), "the full run's store use recorded")
    assert counted == {k: float(v) for k, v in refused.items()}  # dpobs's count: Ray's
    assert "node" not in alert["labels"]  # the refusal's arm (per job), not fullness's
    assert used_max["value"] < KNOBS.ray_store_full_frac


def test_a_store_held_above_its_knob_pages_as_full_for_its_node(stack):
    """Spilling off and more held than the store holds: nothing refused (Ray allocates the
    rest on disk), but the node's store stays above the knob for its `for:`."""
    job = "ray-pinned"
    with driving(stack, "pinned", job) as driver:
        [alert] = until(lambda: managed(stack, FULL, job), f"{FULL} in Alertmanager")
        used = one(stack, f'{names.JOB_NODE_RAY_STORE_USED}{{job="{job}"}}')
        refused = stack.query(f'{names.OP_ERRORS_SERIES}{{job="{job}"}}')
        truth = driver.stop()
    assert alert["labels"]["node"] == driver.ready["node"]
    assert used > KNOBS.ray_store_full_frac
    assert refused == [] and truth["errors"] == {} and truth["steps"] > 0
