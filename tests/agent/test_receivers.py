"""`dpobs agent` against each remote-write receiver that runs here (issue 32): Prometheus 2.42
started as every 2.x is by default (remote-write receiver, no feature flags), the same with
native histograms, and VictoriaMetrics (tests/agent/test_victoria.py). Real binaries on
loopback, two nodes' agents (node-a, node-b), each with one training process of the same
role and rank: per-process series stay apart by `node`.

Each run: training delivered, the receiver stopped for OUTAGE_S and restarted on its data
(the agents' WALs replay), training stopped, then the receiver must hold exactly each
process's own counts. On the flagless Prometheus, node-a runs with the default
--native-histograms auto (the receiver refuses the native queue: the agent says so and
reloads without it) and node-b with `always` (its native queue retried forever:
DpobsAgentDeliveryFailing fires for node-b's native queue only). The classic series of
both arrive whole either way.
"""
from __future__ import annotations

import os
import shutil

import pytest
from helpers.receivers import KNOBS, exact_counts, failing, native_counts, replayed, wait_for

from dpobs_otel.testing.processes import free_port
from dpobs_otel.testing.prometheus import Central, rule_files

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("prometheus") is None and os.environ.get("CI") != "true",
    reason="prometheus not on PATH (apt-get install prometheus)")]


def test_flagless_prometheus_gets_every_classic_series_and_refuses_only_native(
        tmp_path, run_against):
    rules = rule_files(tmp_path / "mixin", **KNOBS)
    with Central(rules, port=free_port(), native=False) as c:
        run = run_against(c, {"node-a": "auto", "node-b": "always"})
        try:
            # node-b's native queue is retried forever against a refusal: the alert names
            # it, and no classic queue (they deliver)
            # (node-a's may fire too, until its reload has dropped the queue)
            firing = wait_for(lambda: ("node-b", "dpobs-central-native") in failing(c)
                              and failing(c), 90, "the delivery alert for node-b")
            assert not {q for _, q in firing} & {"dpobs-central"}, firing
            down, up = run.outage()
            run.finish()
        except AssertionError as e:
            raise AssertionError(f"{e}\n{run.logs()}") from None
        exact_counts(run)
        counted = replayed(run, down, up)
        assert native_counts(run) == {}  # refused: nothing of it stored
        # node-a dropped its native queue (its alert, pending or firing until the reload,
        # resolved); node-b's stays refused and alerting
        # (the restarted receiver re-evaluates the alert's `for:` from the start)
        wait_for(lambda: failing(c) == {("node-b", "dpobs-central-native")}, 30,
                 f"only node-b's native queue failing, not {failing(c)}")
        a, b = run.agents["node-a"].log(), run.agents["node-b"].log()
        assert "refuses native histograms" in a and "native histograms are disabled" in a
        assert "refuses native histograms" not in b
        run.close()  # while the receiver is up: nothing left to flush at shutdown
        print(f"\nflagless 2.42: outage {up - down:.1f} s, samples replayed {counted}")


def test_prometheus_with_native_histograms_gets_both(tmp_path, run_against):
    with Central([], port=free_port(), native=True) as c:
        run = run_against(c, {"node-a": "auto", "node-b": "auto"})
        try:
            down, up = run.outage()
            run.finish()
            want = {(n, op): float(d["calls"]) for n, t in run.truth.items()
                    for op, d in t["ops"].items()}
            wait_for(lambda: native_counts(run) == want, 30, "native counts")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{run.logs()}") from None
        exact_counts(run)
        counted = replayed(run, down, up)
        assert "refuses native histograms" not in run.logs()
        run.close()
        print(f"\nnative 2.42: outage {up - down:.1f} s, samples replayed {counted}")
