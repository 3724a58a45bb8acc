"""`dpobs agent` against VictoriaMetrics (Debian's victoria-metrics 1.79, single node, remote
write at /api/v1/write), as test_receivers.py runs it against Prometheus: two nodes' agents,
a receiver outage replayed from the WALs, per-process counts exact. VictoriaMetrics 1.79
predates native histograms: what it does with the agent's native queue is measured here
(it answers 204 and stores nothing of them). Then vmalert (same package) evaluates the
mixin's shipped rule files against it, and frac_of_step must match each process's truth.
"""
from __future__ import annotations

import http.server
import os
import shutil
import threading
import urllib.request

import pytest
from helpers.receivers import JOB, NODES, exact_counts, native_series, replayed, wait_for

from dpobs_otel import names as n
from dpobs_otel.agent.config import NATIVE_QUEUE
from dpobs_otel.agent.watch import sent_timestamps
from dpobs_otel.testing.prometheus import rule_files
from dpobs_otel.testing.victoria import VictoriaMetrics, VMAlert

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (shutil.which("victoria-metrics") and shutil.which("vmalert")
         and shutil.which("prometheus")) and os.environ.get("CI") != "true",
    reason="victoria-metrics, vmalert, prometheus on PATH (apt-get install victoria-metrics "
           "prometheus)")]

# MetricsQL's rate() does not extrapolate to the window's edges (Prometheus's does); both
# rates of frac_of_step come from the same scrapes, so the ratio keeps to a few percent.
FRAC_REL = 0.05


class Sink(http.server.BaseHTTPRequestHandler):
    """vmalert's notifier: takes the alerts and says nothing (Alertmanager is not tested
    here)."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


def native_sent(agent) -> float:
    with urllib.request.urlopen(f"http://{agent.listen}/metrics", timeout=5) as r:
        return sent_timestamps(r.read().decode()).get(NATIVE_QUEUE, 0.0)


def hash_mismatch_fires(vm: VictoriaMetrics, vmalert: VMAlert) -> None:
    """One mismatched row appears (a counter born at 1, as a guard counts its first): the
    alert's `x > 0 unless x offset 5m` leg must fire under MetricsQL too, at once."""
    row = (f'{n.GUARD_MISMATCHED_SERIES}{{job="{JOB}",node="node-a",role="trainer",rank="0",'
           f'instance="127.0.0.1:1",field="obs"}} 1')
    urllib.request.urlopen(urllib.request.Request(f"{vm.url}/api/v1/import/prometheus",
                                                  data=row.encode()), timeout=10).close()
    alerts = wait_for(lambda: [a for a in vmalert.api.alerts() if a["state"] == "firing"
                               and a["labels"]["alertname"] == "DpobsWireHashMismatch"],
                      30, "DpobsWireHashMismatch from vmalert")
    assert [(a["labels"]["severity"], a["labels"]["role"]) for a in alerts] == \
        [("critical", "trainer")]


def test_victoriametrics_gets_every_classic_series_and_drops_native(tmp_path, run_against):
    with VictoriaMetrics() as vm:
        run = run_against(vm, {node: "auto" for node in NODES})
        try:
            down, up = run.outage()
            run.finish()
        except AssertionError as e:
            raise AssertionError(f"{e}\n{run.logs()}\n--- vm\n{vm.log()}") from None
        exact_counts(run)
        counted = replayed(run, down, up)
        # 1.79 knows no native histograms: it accepts the native queue's batches (the
        # agent's queue moves on, nothing refused) and keeps nothing of them
        assert all(native_sent(a) > 0 for a in run.agents.values())
        assert "refuses native histograms" not in run.logs()
        assert native_series(vm) == 0
        print(f"\nvictoriametrics: outage {up - down:.1f} s, samples replayed {counted}")
        sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
        threading.Thread(target=sink.serve_forever, daemon=True).start()
        rules = rule_files(tmp_path / "mixin")
        try:
            with VMAlert(vm, rules, f"http://127.0.0.1:{sink.server_address[1]}") as vmalert:
                got = wait_for(lambda: len(vm.query(n.INSTANCE_FRAC_OF_STEP)) == 2 and
                               vm.query(n.INSTANCE_FRAC_OF_STEP), 60, "vmalert's records")
                frac = {r["metric"]["node"]: r["value"] for r in got}
                for node, truth in run.truth.items():
                    want = sum(d["seconds"] for d in truth["ops"].values()) / truth["step_s"]
                    assert abs(frac[node] - want) <= FRAC_REL * want, (node, frac, want)
                print(f"vmalert frac_of_step {frac}")
                # the classic quantiles are recorded (from a record of the bucket rates: under
                # vmalert a record is read back from the database, an evaluation or two late);
                # the native ones have no input here
                wait_for(lambda: vm.query(n.JOB_OP_QUANTILE), 30, "the classic quantiles")
                assert not vm.query(n.JOB_OP_NATIVE_QUANTILE)
                hash_mismatch_fires(vm, vmalert)
                assert "error" not in vmalert.log().lower(), vmalert.log()
        finally:
            sink.shutdown()
        run.close()  # while the receiver is up: nothing left to flush at shutdown
