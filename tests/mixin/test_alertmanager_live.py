"""The shipped Alertmanager routing, exercised on a live Alertmanager (loopback only): alerts
are posted through its v2 API and the inhibition it reports is read back, so what is checked
is Alertmanager's own behaviour, not our reading of the config."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from dpobs_otel.testing.processes import die_with_parent, free_port
from dpobs_otel.testing.stack import binaries

ROOT = Path(__file__).resolve().parents[2]
ALERTMANAGER_YML = ROOT / "deploy/alertmanager/alertmanager.yml"


def _loopback_config(tmp: Path) -> Path:
    """The shipped config with every webhook pointed at a closed loopback port: routing and
    inhibition are unchanged, and no notification can leave the machine."""
    cfg = yaml.safe_load(ALERTMANAGER_YML.read_text())
    for receiver in cfg["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"http://127.0.0.1:{free_port()}/closed"
    path = tmp / "alertmanager.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory):
    exe = binaries()["alertmanager"]
    if exe is None:
        pytest.fail("alertmanager is not on PATH (Debian: apt-get install prometheus-alertmanager)")
    tmp = tmp_path_factory.mktemp("am")
    url = f"http://127.0.0.1:{free_port()}"
    log = open(tmp / "log", "wb")
    proc = subprocess.Popen(
        [exe, f"--config.file={_loopback_config(tmp)}", f"--storage.path={tmp / 'data'}",
         f"--web.listen-address={url[7:]}", "--cluster.listen-address="],
        stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("alertmanager did not start:\n" + (tmp / "log").read_text())
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def post(url: str, alerts: list[dict]) -> None:
    body = json.dumps(alerts).encode()
    req = urllib.request.Request(f"{url}/api/v2/alerts", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).close()


def alert(severity: str, **labels: str) -> dict:
    return {"labels": {"severity": severity, "job": "dpobs", **labels}}


def inhibition(url: str, test_id: str, want: int) -> dict[tuple, list]:
    """(alertname, job, op, severity) -> status.inhibitedBy, for the alerts of this test, once
    Alertmanager has taken all `want` of them in and settled (the inhibitor learns sources
    asynchronously, so wait until two reads agree)."""
    deadline, last = time.monotonic() + 20, None
    while True:
        with urllib.request.urlopen(f"{url}/api/v2/alerts?filter=test=%22{test_id}%22",
                                    timeout=10) as r:
            got = {(a["labels"]["alertname"], a["labels"]["job"], a["labels"].get("op", ""),
                    a["labels"]["severity"]): sorted(a["status"]["inhibitedBy"])
                   for a in json.load(r)}
        if len(got) == want and got == last:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"alertmanager did not settle: {got}")
        last = got
        time.sleep(0.5)


def test_critical_inhibits_only_the_warning_of_the_same_op(alertmanager):
    post(alertmanager, [
        alert("critical", alertname="DpobsOperationErrors", op="get", test="op"),
        alert("warning", alertname="DpobsOperationErrors", op="get", test="op"),
        alert("warning", alertname="DpobsOperationErrors", op="put", test="op"),
    ])
    got = inhibition(alertmanager, "op", 3)
    assert got[("DpobsOperationErrors", "dpobs", "get", "critical")] == []
    assert len(got[("DpobsOperationErrors", "dpobs", "get", "warning")]) == 1  # same op
    assert got[("DpobsOperationErrors", "dpobs", "put", "warning")] == []  # other op: ticket


def test_critical_inhibits_the_warning_of_an_alert_without_op(alertmanager):
    """Alerts with no op label (both sides empty) still pair warning with critical."""
    post(alertmanager, [
        alert("critical", alertname="DpobsDataPlaneDominatesStep", test="noop"),
        alert("warning", alertname="DpobsDataPlaneDominatesStep", test="noop"),
        alert("warning", alertname="DpobsDataPlaneDominatesStep", job="other", test="noop"),
    ])
    got = inhibition(alertmanager, "noop", 3)
    assert len(got[("DpobsDataPlaneDominatesStep", "dpobs", "", "warning")]) == 1
    assert got[("DpobsDataPlaneDominatesStep", "other", "", "warning")] == []


def test_critical_does_not_inhibit_other_jobs_or_alerts(alertmanager):
    post(alertmanager, [
        alert("critical", alertname="DpobsOperationErrors", op="get", test="jobs"),
        alert("warning", alertname="DpobsOperationErrors", op="get", job="other", test="jobs"),
        alert("warning", alertname="DpobsTargetDown", test="jobs"),
    ])
    got = inhibition(alertmanager, "jobs", 3)
    assert all(v == [] for k, v in got.items() if k[3] == "warning"), got
