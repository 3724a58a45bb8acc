"""The demo report's first line and its tables (issue 56): the job's verdict on top, the same
sentence `dpobs report` prints; classic-bucket percentiles only where no native histogram is,
with the bucket bound each lies below; the critical-path table left out when every process
repeats one figure; the guard's unverified rows and skipped fields explained; the cluster
view's max_ms named a bucket bound; the rules table's names whole. Inputs written here, the
expected cells worked out by hand."""
from __future__ import annotations

from dpobs_otel import names as nm
from dpobs_otel.demo import critical
from dpobs_otel.demo import report as demo
from dpobs_otel.demo.batches import Config
from dpobs_otel.demo.guard_report import guard_line
from dpobs_otel.demo.truth import Durations
from dpobs_otel.readback.headline import Numbers, sentence


def truth(step_s, get_s, exposed_s, busy_s=None) -> dict:
    d = Durations()
    d.add(get_s)
    busy_s = exposed_s if busy_s is None else busy_s
    return {"steps": 4, "step_s": step_s, "busy_s": busy_s, "exposed_s": exposed_s,
            "bytes": {("get", "read"): 100}, "ops": {"get": d}}


def samples(step_s, get_s, exposed_s, guard=()) -> list:
    return [(f"{nm.STEP_DURATION_SERIES}_sum", {}, step_s),
            (f"{nm.OP_DURATION_SERIES}_sum", {"op": "get"}, get_s),
            (f"{nm.OP_DURATION_SERIES}_count", {"op": "get"}, 1.0),
            (f"{nm.OP_DURATION_SERIES}_bucket", {"op": "get", "le": "0.025"}, 0.0),
            (f"{nm.OP_DURATION_SERIES}_bucket", {"op": "get", "le": "0.05"}, 1.0),
            (f"{nm.OP_DURATION_SERIES}_bucket", {"op": "get", "le": "+Inf"}, 1.0),
            (nm.STEP_BUSY_SERIES, {}, exposed_s), (nm.STEP_EXPOSED_SERIES, {}, exposed_s),
            *guard]


GUARD = [(nm.GUARD_CHECKED_SERIES, {"field": "x"}, 30.0),
         (nm.GUARD_MISMATCHED_SERIES, {"field": "x"}, 1.0),
         (nm.GUARD_UNVERIFIED_SERIES, {"field": "meta"}, 12.0),
         (nm.GUARD_SKIPPED_SERIES, {"reason": "non_tensor"}, 3.0)]


def result(lockstep: bool = True) -> demo.Result:
    """trainer 0: 10 s of steps, 4 s in get, all exposed; trainer 1: 10 s, 1 s (with
    lockstep=False, 0.5 s of it exposed)."""
    a, b = ("trainer", 0), ("trainer", 1)
    return demo.Result(
        info={a: {"instance": "h:1"}, b: {"instance": "h:2"}},
        warm={a: truth(1.0, 0.0, 0.0), b: truth(1.0, 0.0, 0.0)},
        truth={a: truth(10.0, 4.0, 4.0), b: truth(10.0, 1.0, 1.0 if lockstep else 0.5)},
        scraped={a: samples(11.0, 4.0, 4.0, GUARD), b: samples(11.0, 1.0, 1.0)})


def test_the_verdict_without_prometheus_is_headlines_sentence_from_the_truth():
    line = demo.verdict_line(result(), None, Config(verify=True))
    # (4 + 1) / 20 of the step, all exposed; get the only op; trainer 0 the largest fraction
    said = sentence(Numbers(0.25, 0.25, "get", "trainer 0", 30.0, 1.0))
    assert line.endswith(": " + said) and line.startswith("Verdict")
    assert demo.verdict_line(result(), None, Config()).endswith("guard: off")


def test_the_verdict_with_prometheus_is_dpobs_reports_line(monkeypatch):
    from dpobs_otel.report import command
    asked = []
    monkeypatch.setattr(command, "verdict",
                        lambda p, sd, job: asked.append((p, sd, job)) or "the rules' line")

    class Stack:
        prometheus = "http://127.0.0.1:9"
    assert demo.verdict_line(result(), Stack(), Config(job="j")) == "Verdict: the rules' line"
    assert asked == [("http://127.0.0.1:9", None, "j")]


def test_the_report_opens_with_the_verdict():
    text = demo.report(result(), None, Config(verify=True))
    assert text.splitlines()[0] == demo.verdict_line(result(), None, Config(verify=True))


def test_classic_percentiles_only_without_native_and_with_their_bound():
    text = demo.report(result(), None, Config())  # res.native None: no native histograms
    rows = [line.split() for line in text.splitlines()]
    classic = next(r for r in rows if r[:1] == ["classic"])
    bound = rows[rows.index(classic) + 1]
    # one call in (25, 50] ms: every percentile interpolated there, below the bound 50
    assert bound == ["bound", "<=", "50", "50", "50"]


def test_classic_rows_left_out_where_native_histograms_exist(monkeypatch):
    class Hist:
        count, sum = 1, 0.04

        def quantile(self, q):
            return 0.04
    monkeypatch.setattr(demo.native, "pooled", lambda *a, **k: Hist())
    text = demo.report(result(), None, Config())
    sources = [line.split()[0] for line in text.splitlines() if line.startswith("   ")]
    assert "native" in sources and "classic" not in sources and "bound" not in sources


def test_the_critical_path_table_is_one_line_when_every_process_repeats_one_figure():
    lines = critical.critical_path_lines(result(), None)
    assert not [line for line in lines if line.strip().startswith("trainer")]
    assert any("left out" in line for line in lines)
    assert any(line.strip().startswith("job") for line in lines)  # the job's rows stay
    lines = critical.critical_path_lines(result(lockstep=False), None)
    assert [line for line in lines if line.strip().startswith("trainer 1")]
    assert not any("left out" in line for line in lines)


def test_unverified_rows_and_skipped_fields_are_explained():
    text = guard_line(GUARD, Config(verify=True))
    assert "unverified 12, fields skipped 3" in text
    unverified = next(line for line in text.splitlines() if "unverified:" in line)
    assert "no usable digest" in unverified and "meta 12" in unverified
    skipped = next(line for line in text.splitlines() if "fields skipped:" in line)
    assert "non_tensor 3: not a tensor" in skipped


def test_the_cluster_views_max_is_named_a_bucket_bound():
    columns = ["op", "calls", "mean_ms", "max_ms", "mb", "share", "slowest_role",
               "slowest_rank", "p99_ms"]
    lines = "\n".join(demo._cluster_lines({}, (columns, [["get", 1, 40.0, 50.0, 0.1, 1.0,
                                                           "trainer", "0", 45.0]])))
    assert "max_ms" not in lines and demo.MAX_BOUND in lines and "bucket bound" in lines


def test_the_rules_table_shows_whole_rule_names():
    class Rules:
        def query(self, expr):
            return [] if "native" in expr else [{"metric": {}, "value": 0.04}]

        def wait_alerts(self, want):
            return []
    measured = demo.merge(result().truth.values())
    lines = demo._prometheus_lines(Rules(), measured, Config())
    classic = f'{nm.JOB_OP_QUANTILE}{{op="get",quantile="0.99"}}'
    assert any(line.strip().startswith(classic + " (ms, classic") for line in lines)
    assert not any(nm.JOB_OP_NATIVE_QUANTILE in line for line in lines)  # no native value
