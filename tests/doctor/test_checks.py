"""The doctor's checks that judge what Prometheus answered, from canned answers: a rule group
evaluated late or never, a failing rule, and the arguments that cannot be checked at all."""
from __future__ import annotations

import subprocess
import sys

from dpobs_otel.doctor import checks
from dpobs_otel.doctor.command import diagnose

NOW = 1_800_000_000.0


def group(name: str, last: str, interval: float = 1.0, health: str = "ok") -> dict:
    rule = next(iter(checks._mixin_rules("record")))
    return {"name": name, "interval": interval, "lastEvaluation": last,
            "rules": [{"name": rule, "type": "recording", "health": health,
                       "lastError": "boom" if health == "err" else ""}]}


def test_a_group_evaluated_within_twice_its_interval_holds_later_or_never_fails():
    fresh = group("dpobs-recording", "2027-01-15T08:00:00Z", interval=1.0)  # NOW - 0 s
    assert checks.evaluating([fresh], now=NOW).ok is True
    assert checks.evaluating([fresh], now=NOW + 5.5).ok is True  # a busy server's slack
    assert checks.evaluating([fresh], now=NOW + 6.5).ok is False
    slow = group("dpobs-recording", "2027-01-15T08:00:00Z", interval=60.0)
    assert checks.evaluating([slow], now=NOW + 119).ok and not checks.evaluating(
        [slow], now=NOW + 121).ok
    c = checks.evaluating([group("dpobs-recording", "0001-01-01T00:00:00Z")], now=NOW)
    assert c.ok is False and "last never" in c.line() and "fix:" in c.line()


def test_a_failing_rule_is_named_with_its_error():
    c = checks.evaluating([group("dpobs-recording", "2027-01-15T08:00:00Z", health="err")],
                          now=NOW)
    assert c.ok is False and "boom" in c.said


def test_no_dpobs_group_is_not_run_rather_than_failed_twice():
    other = {"name": "theirs", "interval": 1, "lastEvaluation": "0001-01-01T00:00:00Z",
             "rules": [{"name": "x", "type": "recording", "health": "ok"}]}
    assert checks.evaluating([other], now=NOW).ok is None


def test_a_missing_directory_and_a_bad_url_are_one_line_each_and_exit_1(tmp_path):
    found = diagnose(str(tmp_path / "nope"), "localhost:9090", None, None)
    assert [(c.name, c.ok) for c in found] == [("registered", False), ("prometheus", False)]
    out = subprocess.run([sys.executable, "-m", "dpobs_otel.cli", "doctor", "--sd-dir",
                          str(tmp_path / "nope"), "--prometheus", "http://127.0.0.1:9",
                          "--alertmanager", "http://127.0.0.1:9"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr == "", out.stderr
    shown = out.stdout.splitlines()
    assert [line.split()[:2] for line in shown[:-1]] == [
        ["FAIL", "registered:"], ["FAIL", "prometheus:"], ["FAIL", "alertmanager:"]]
    assert "no directory" in shown[0] and "unreachable" in shown[1]


def test_a_process_over_its_label_budget_is_named_from_either_source():
    from dpobs_otel.readback.scrape import ProcessTotals
    from dpobs_otel.readback.sources import Reading, Seen
    labels = {"job": "j", "instance": "h:1", "role": "trainer", "rank": "2"}
    over = ProcessTotals(instrumentation_errors={checks.OVERFLOW: 5.0, "guard": 1.0})
    fine = ProcessTotals(instrumentation_errors={"guard": 1.0})
    reading = Reading({("a",): Seen(labels, over), ("b",): Seen(dict(labels, rank="3"), fine)},
                      set())
    c = checks.label_budget(None, None, reading)
    assert c.ok is False and "trainer 2 at h:1 (5 folded)" in c.said and "trainer 3" not in c.said

    class Prom:  # what Prometheus answers to the doctor's one query
        def query(self, expr):
            assert f'component="{checks.OVERFLOW}"' in expr and 'job="j"' in expr
            return [{"metric": labels, "value": 7.0}]
    c = checks.label_budget(Prom(), "j", None)
    assert c.ok is False and "(7 folded)" in c.said and "fix:" in c.line()
    assert checks.label_budget(None, None, Reading({("b",): Seen(labels, fine)}, set())).ok
