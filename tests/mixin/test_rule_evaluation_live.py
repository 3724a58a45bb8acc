"""DpobsRuleEvaluationSlow on a live Prometheus 2.x: the shipped prometheus.yml (its self-scrape
job included, pointed at this Prometheus's port) and the mixin's rules, beside one more dpobs
rules file whose group takes longer than its interval (a subquery of 1.2 million steps every
100 ms). The alert fires for that group and stays silent for every shipped group, whose own
evaluation is measured by the same self-scrape."""
from __future__ import annotations

import pytest
from helpers.multinode import wait_for

from dpobs_otel import names
from dpobs_otel.mixin.config import Config
from dpobs_otel.testing.stack import Stack, binaries

HEAVY_GROUP = "dpobs-heavy"
HEAVY = f"""groups:
  - name: {HEAVY_GROUP}
    interval: 100ms
    rules:
      - record: dpobs_test:heavy
        expr: sum_over_time(vector(1)[20m:1ms])
"""
# The alert as shipped, less its waits: fire at the first evaluation that sees it, and read
# missed evaluations over a window this test lasts.
KNOBS = Config(rule_evaluation_slow_for="", rule_evaluation_missed_window="30s")


def _slow(st: Stack, state: str = "firing") -> set[str]:
    """The rule groups DpobsRuleEvaluationSlow is in `state` for ("": any state)."""
    return {a["labels"]["rule_group"] for a in st.prom.alerts()
            if a["labels"]["alertname"] == names.ALERT_RULE_EVALUATION_SLOW
            and a["state"] == (state or a["state"])}


def _scraped(st: Stack, metric: str) -> dict[str, float]:
    """rule group -> `metric`'s value, as Prometheus's self-scrape delivered it."""
    return {s["metric"]["rule_group"]: s["value"] for s in st.query(metric)}


def _monitoring_iterations(st: Stack) -> float:
    return next((v for g, v in _scraped(st, "prometheus_rule_group_iterations_total").items()
                 if g.endswith(";dpobs-monitoring")), 0.0)


def _stack_or_fail():
    if None in binaries().values():
        pytest.fail("prometheus and alertmanager must be on PATH (Debian: apt-get install "
                    "prometheus prometheus-alertmanager)")


def test_a_dpobs_group_slower_than_its_interval_fires_and_the_shipped_groups_do_not(tmp_path):
    _stack_or_fail()
    heavy = tmp_path / "dpobs-heavy.rules.yml"
    heavy.write_text(HEAVY)
    with Stack(mixin=KNOBS, rules=[str(heavy)]) as st:
        firing = wait_for(lambda: _slow(st), 45, "DpobsRuleEvaluationSlow to fire")
        measured = _scraped(st, "prometheus_rule_group_last_duration_seconds")
        firing |= _slow(st, "")
    heavy_group = f"{heavy};{HEAVY_GROUP}"
    assert firing == {heavy_group}, firing
    # the shipped groups were measured by the same self-scrape, and none of them fired
    assert {g.split(";")[1] for g in measured} >= {"dpobs-monitoring", "dpobs-data-plane",
                                                   HEAVY_GROUP}


def test_a_healthy_stack_stays_silent(tmp_path):
    """The shipped files alone: once the self-scrape has delivered the rule groups' series,
    the alert is evaluated over them at least five times, without error, and never pends."""
    _stack_or_fail()
    with Stack(mixin=KNOBS) as st:
        seen = wait_for(lambda: _monitoring_iterations(st), 45, "the self-scrape's rule series")
        wait_for(lambda: _monitoring_iterations(st) >= seen + 5, 45, "five more evaluations")
        assert _slow(st, "") == set()
        [rule] = [r for g in st.prom.rules() for r in g["rules"]
                  if r["name"] == names.ALERT_RULE_EVALUATION_SLOW]
        assert rule["health"] == "ok", rule
        groups = _scraped(st, "prometheus_rule_group_last_duration_seconds")
    assert len(groups) >= 5 and all(";dpobs-" in g for g in groups), groups
