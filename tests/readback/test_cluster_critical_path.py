"""The cluster view's busy_frac, exposed_frac and exposed_frac_max from synthetic /metrics
bodies: each process's counters are written out as a process would serve them, read by a
source that returns them at each call, and the expected values are worked out here from the
schedule (the counters' changes between calls), not by the code under test."""
from __future__ import annotations

import pytest

from dpobs_otel import names
from dpobs_otel.readback import cluster, scrape
from dpobs_otel.readback.sources import Reading, Seen

P = cluster.PREFIX
LABELS = ("job", "node", "instance", "role", "rank")


def body(step_count: float, step_sum: float, get_sum: float, busy: float | None = None,
         exposed: float | None = None, instance_id: str = "one") -> str:
    """One process's exposition as opentelemetry-exporter-prometheus writes it; busy and
    exposed None: the counter was never incremented, so the series is not there."""
    lines = [f'target_info{{service_instance_id="{instance_id}"}} 1.0',
             f"# TYPE {names.STEP_DURATION_SERIES} histogram",
             f'{names.STEP_DURATION_SERIES}_bucket{{le="+Inf"}} {step_count}',
             f"{names.STEP_DURATION_SERIES}_count {step_count}",
             f"{names.STEP_DURATION_SERIES}_sum {step_sum}",
             f'{names.OP_DURATION_SERIES}_count{{op="get"}} {step_count}',
             f'{names.OP_DURATION_SERIES}_sum{{op="get"}} {get_sum}']
    for series, value in ((names.STEP_BUSY_SERIES, busy), (names.STEP_EXPOSED_SERIES, exposed)):
        if value is not None:
            lines += [f"# TYPE {series} counter", f"{series} {value}"]
    return "\n".join(lines) + "\n"


class Bodies:
    """A source whose read() parses the bodies set for this call (instance -> body)."""

    def __init__(self):
        self.now: dict[str, str] = {}

    def read(self) -> Reading:
        out = {}
        for inst, text in self.now.items():
            key = ("j", "", inst, "trainer", inst[-1])
            out[key] = Seen(dict(zip(LABELS, key)), scrape.parse(text), None)
        return Reading(out, set())


@pytest.fixture
def view():
    v = cluster.ClusterView("/nonexistent-sd-dir")
    v.source = Bodies()
    return v


def test_parse_reads_the_two_counters_and_absent_reads_zero():
    t = scrape.parse(body(4, 2.0, 1.5, busy=1.25, exposed=0.75))
    assert (t.busy_seconds, t.exposed_seconds) == (1.25, 0.75)
    t = scrape.parse(body(4, 2.0, 1.5))
    assert (t.busy_seconds, t.exposed_seconds) == (0.0, 0.0)


def test_fractions_are_summed_counter_changes_over_summed_step_seconds(view):
    # Cumulative values at the two calls: (steps, step seconds, get seconds, busy, exposed).
    first = {"h:1": (10, 10.0, 4.0, 2.0, 1.0),      # prefetching: busy > exposed
             "h:2": (5, 5.0, 1.0, None, None),       # never in flight: no counters at all
             "h:3": (40, 20.0, 12.0, 8.0, 9.0)}      # restarts before the second call
    second = {"h:1": (16, 16.0, 10.0, 5.0, 1.5),
              "h:2": (9, 9.0, 2.0, None, None),
              "h:3": (3, 3.0, 1.0, 1.0, 1.5),        # since its restart (exposed > busy:
              "h:4": (2, 2.0, 0.5, 0.5, 0.25)}       # an empty queue); h:4 is new
    view.source.now = {i: body(*v, instance_id="a") for i, v in first.items()}
    view.step_metrics()
    view.source.now = {i: body(*v, instance_id="b" if i == "h:3" else "a")
                       for i, v in second.items()}
    got = view.step_metrics()

    # Each process's window: h:1 and h:2 changed, h:3 counts since its restart, h:4 since
    # its start; an absent counter is a process that had nothing in flight.
    step = {"h:1": 6.0, "h:2": 4.0, "h:3": 3.0, "h:4": 2.0}
    busy = {"h:1": 3.0, "h:2": 0.0, "h:3": 1.0, "h:4": 0.5}
    exposed = {"h:1": 0.5, "h:2": 0.0, "h:3": 1.5, "h:4": 0.25}
    assert got[P + "processes_restarted"] == 1
    assert got[P + "step_s"] == pytest.approx(15.0)
    assert got[P + "busy_s"] == pytest.approx(4.5)
    assert got[P + "exposed_s"] == pytest.approx(2.25)
    assert got[P + "busy_frac"] == pytest.approx(4.5 / 15.0)
    assert got[P + "exposed_frac"] == pytest.approx(2.25 / 15.0)
    assert got[P + "exposed_frac_max"] == pytest.approx(0.5)  # h:3, 1.5 of its 3 s
    assert got[P + "exposed_frac_max"] == pytest.approx(
        max(exposed[i] / step[i] for i in step))
    assert got[P + "busy_frac"] == pytest.approx(sum(busy.values()) / sum(step.values()))
    # op-seconds keeps its meaning beside them: (6 + 1 + 1 + 0.5) / 15
    assert got[P + "frac_of_step"] == pytest.approx(8.5 / 15.0)


def test_without_a_completed_step_the_fractions_are_absent(view):
    view.source.now = {"h:1": body(3, 3.0, 1.0, busy=1.0, exposed=1.0)}
    view.step_metrics()
    got = view.step_metrics()  # nothing changed
    assert got[P + "busy_s"] == 0.0 and got[P + "exposed_s"] == 0.0
    assert not {P + k for k in ("busy_frac", "exposed_frac", "exposed_frac_max",
                                "frac_of_step")} & set(got)


def test_a_counter_that_goes_back_is_a_restart(view):
    view.source.now = {"h:1": body(3, 3.0, 1.0, busy=2.0, exposed=1.0)}
    view.step_metrics()
    # Same instance id, steps and op time grew, busy fell: only a restart explains it.
    view.source.now = {"h:1": body(4, 4.0, 1.5, busy=0.5, exposed=1.0)}
    got = view.step_metrics()
    assert got[P + "processes_restarted"] == 1
    assert got[P + "busy_s"] == pytest.approx(0.5)  # since the restart: its whole value
