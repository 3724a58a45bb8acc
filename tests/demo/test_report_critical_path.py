"""`dpobs compare`'s table and the demo report's three fractions of step time (op-seconds,
busy, exposed), per process and for the job: from the workload's clock, from each process's
/metrics samples and from the recording rules. The inputs are written here and the expected
cells worked out by hand."""
from __future__ import annotations

import re

from dpobs_otel import names as nm
from dpobs_otel.demo import compare, critical
from dpobs_otel.demo import report as demo
from dpobs_otel.demo.truth import Durations


def truth(steps, step_s, get_s, busy_s, exposed_s) -> dict:
    d = Durations()
    d.add(get_s)
    return {"steps": steps, "step_s": step_s, "busy_s": busy_s, "exposed_s": exposed_s,
            "bytes": {}, "ops": {"get": d}}


def samples(step_s, get_s, busy_s, exposed_s) -> list:
    return [(f"{nm.STEP_DURATION_SERIES}_sum", {}, step_s),
            (f"{nm.OP_DURATION_SERIES}_sum", {"op": "get"}, get_s),
            (nm.STEP_BUSY_SERIES, {}, busy_s), (nm.STEP_EXPOSED_SERIES, {}, exposed_s)]


class Rules:
    """A stack whose query() answers the rules from a table."""

    def __init__(self, values: dict):
        self.values = values

    def query(self, expr):
        return [{"metric": m, "value": v} for m, v in self.values.get(expr, [])]


def result() -> demo.Result:
    a, b = ("trainer", 0), ("trainer", 1)
    return demo.Result(
        info={a: {"instance": "h:1"}, b: {"instance": "h:2"}},
        warm={a: truth(1, 1.0, 0.5, 0.5, 0.5), b: truth(1, 1.0, 0.5, 0.5, 0.5)},
        truth={a: truth(9, 9.0, 4.5, 3.5, 0.5), b: truth(9, 9.0, 1.5, 1.5, 1.5)},
        scraped={a: samples(10.0, 5.0, 4.0, 1.0), b: samples(10.0, 2.0, 2.0, 2.0)})


def cells(lines: list[str], process: str, span: str, source: str) -> list[str]:
    """The three cells of one row (rows name the process and span on their first line only)."""
    current = {"process": "", "span": ""}
    for line in lines[2:]:
        m = re.match(r"  (.{12})(.{16})(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$", line)
        if not m:
            continue
        current["process"] = m[1].strip() or current["process"]
        current["span"] = m[2].strip() or current["span"]
        if (current["process"], current["span"], m[3]) == (process, span, source):
            return [m[4], m[5], m[6]]
    raise AssertionError(f"no row {process} / {span} / {source} in\n" + "\n".join(lines))


def test_three_fractions_from_truth_metrics_and_rules():
    rules = Rules({
        nm.INSTANCE_FRAC_OF_STEP: [({"instance": "h:1"}, 0.5), ({"instance": "h:2"}, 0.2)],
        nm.INSTANCE_BUSY_FRAC_OF_STEP: [({"instance": "h:1"}, 0.4), ({"instance": "h:2"}, 0.2)],
        nm.INSTANCE_EXPOSED_FRAC_OF_STEP: [({"instance": "h:1"}, 0.05)],  # h:2: no series
        nm.JOB_FRAC_OF_STEP: [({}, 0.35)], nm.JOB_BUSY_FRAC_OF_STEP: [({}, 0.3)],
        nm.JOB_EXPOSED_FRAC_OF_STEP: [({}, 0.125)],
        nm.JOB_MAX_EXPOSED_FRAC_OF_STEP: [({}, 0.25)]})
    lines = critical.critical_path_lines(result(), rules)
    # trainer 0: every step 10 s, get 5, busy 4, exposed 1; measured 9 s, 4.5, 3.5, 0.5
    assert cells(lines, "trainer 0", "every step", "truth") == ["50.0%", "40.0%", "10.0%"]
    assert cells(lines, "trainer 0", "every step", "metrics") == ["50.0%", "40.0%", "10.0%"]
    assert cells(lines, "trainer 0", "measured steps", "truth") == ["50.0%", "38.9%", "5.6%"]
    assert cells(lines, "trainer 0", "measured steps", "rules") == ["50.0%", "40.0%", "5.0%"]
    assert cells(lines, "trainer 1", "measured steps", "rules") == ["20.0%", "20.0%", "-"]
    # job, every step: (5 + 2) / 20, (4 + 2) / 20, (1 + 2) / 20
    assert cells(lines, "job", "every step", "truth") == ["35.0%", "30.0%", "15.0%"]
    assert cells(lines, "job", "every step", "metrics") == ["35.0%", "30.0%", "15.0%"]
    # measured: (4.5 + 1.5) / 18, (3.5 + 1.5) / 18, (0.5 + 1.5) / 18
    assert cells(lines, "job", "measured steps", "truth") == ["33.3%", "27.8%", "11.1%"]
    assert cells(lines, "job", "measured steps", "rules") == ["35.0%", "30.0%", "12.5%"]
    assert lines[-1].endswith(f"({nm.JOB_MAX_EXPOSED_FRAC_OF_STEP}): 25.0%")


def test_without_prometheus_there_are_no_rules_rows():
    lines = critical.critical_path_lines(result(), None)
    assert cells(lines, "trainer 1", "every step", "truth") == ["20.0%", "20.0%", "20.0%"]
    assert cells(lines, "trainer 1", "every step", "metrics") == ["20.0%", "20.0%", "20.0%"]
    assert not [line for line in lines if "rules" in line.split()]
    assert critical.fractions(truth(0, 0.0, 0.0, 0.0, 0.0)) == (None, None, None)


def test_compare_prints_the_three_fractions_per_backend():
    nan = float("nan")
    one = {"ops": {}, "roles": {}, "frac": (0.6, 0.625), "own": 0.01, "guard": None,
           "critical": {"busy": (0.5, 0.5), "exposed": (0.125, None),
                        "most stalled": (0.25, None)}}
    two = dict(one, frac=(0.3, 0.3), critical={"busy": (nan, None), "exposed": (0.05, 0.0625),
                                               "most stalled": (nan, None)})
    lines = compare.table({"memory": one, "mooncake": two}).splitlines()

    def row(label):
        (line,) = [x for x in lines if x.strip().startswith(label + "  ")]
        return re.split(r"\s{2,}", line.strip())[1:]
    assert row("job") == ["60.0% (62.5%)", "30.0% (30.0%)"]
    assert row("busy") == ["50.0% (50.0%)", "-"]
    assert row("exposed") == ["12.5%", "5.0% (6.2%)"]
    assert row("most stalled") == ["25.0%", "-"]
