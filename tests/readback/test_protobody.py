"""readback/protobody.py: one protobuf body gives the ProcessTotals the text body of the same
moment gives (every family matters: dropping any one the totals read changes them), and the
native histograms native.decode gives; the decoder against messages the protobuf runtime
encodes the way client_golang lays them out; the cluster view asks each endpoint once per call,
and an endpoint that answers in text still gives its counters (no quantiles)."""
from __future__ import annotations

import dataclasses
import math

import pytest
from google.protobuf.internal.encoder import _VarintBytes
from helpers.protodecode import CLASSES
from helpers.workload import exercise
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import dpobs_otel as dpobs
from dpobs_otel import names
from dpobs_otel.exporters import protobuf
from dpobs_otel.readback import native, protobody, scrape
from dpobs_otel.readback.cluster import ClusterView

JOB = "dpobs-one"
Q = ("p50_ms", "p90_ms", "p99_ms")


@pytest.fixture(scope="module")
def bodies():
    """(text, protobuf) of one process with traffic on every op, steps, codec, the guard on
    (with a failure) and row age on, rendered back to back: nothing runs between them."""
    tel = dpobs.start(role="one", rank=0, port=0, verify_tensor_hash=True, row_age=True)
    try:
        exercise(tel)
        exercise(tel)  # every counter is past one
        tel.stats.ops["get"].missing += 3  # what a store's short answer counts (client.py)
        exporter = tel.exporters[0]
        yield generate_latest(exporter.registry).decode(), exporter.render_protobuf()
    finally:
        tel.shutdown()


def _proto_totals(body: bytes) -> scrape.ProcessTotals:
    """What the cluster view takes from a protobuf answer (protobody.read's parse)."""
    return protobody.parse(protobuf.CONTENT_TYPE, body)[0]


def test_protobuf_totals_equal_text_totals_field_by_field(bodies):
    text, body = bodies
    want, got = scrape.parse(text), _proto_totals(body)
    for f in dataclasses.fields(scrape.ProcessTotals):
        assert getattr(got, f.name) == getattr(want, f.name), f.name
    # nothing compared is empty: each field was exercised
    assert set(want.ops) == {"put", "get", "list", "clear"}
    for op, o in want.ops.items():
        assert o.calls > 0 and o.seconds > 0 and o.buckets[math.inf] == o.calls, op
    assert want.ops["get"].errors > 0 and want.ops["get"].missing > 0
    assert want.ops["put"].write_bytes > 0 and want.ops["get"].read_bytes > 0
    assert want.steps == 2 and want.step_seconds > 0 and want.busy_seconds > 0
    assert want.row_age_rows > 0 and want.codec_seconds.keys() == {"pack"}
    assert want.instrumentation_seconds and want.instrumentation_errors
    assert want.outstanding_bytes > 0 and want.outstanding_keys > 0 and want.instance_id
    assert want.guard["rows_recorded"] > 0 and want.guard["rows_checked"] > 0
    assert want.guard["failures"] > 0 and want.guard["rows_unverified"] > 0
    # the native histograms of the same body: what native.decode reads, by op
    _, hists = protobody.decode(body, protobody._KEEP)
    assert hists == native.decode(body)
    assert {dict(k[1])["op"] for k in hists} == set(want.ops) | set(want.ray_ops)
    assert protobody.parse(protobuf.CONTENT_TYPE, body)[1] == native.by_label(
        hists, names.OP_DURATION_NATIVE_SERIES, "op")
    assert protobody.parse("text/plain; version=0.0.4", text.encode()) == (want, None)
    for (name, labels), h in hists.items():
        assert name == names.OP_DURATION_NATIVE_SERIES
        op = dict(labels)["op"]
        assert h.count == (want.ops.get(op) or want.ray_ops[op]).calls


def _families(body: bytes) -> list[tuple[str, bytes]]:
    """(name, delimited message) of each family of a body, in order."""
    out, pos = [], 0
    while pos < len(body):
        size, start = native._varint(body, pos)
        name = next(v.decode() for n, _, v in native.fields(body[start:start + size])
                    if n == 1)
        out.append((name, body[pos:start + size]))
        pos = start + size
    return out


def test_dropping_any_family_the_totals_read_changes_them(bodies):
    """The equivalence above is not vacuous: every family is needed to get the same totals,
    but the two ProcessTotals has no field for and those whose every value is 0 (an absent
    series reads 0)."""
    text, body = bodies
    fams = _families(body)
    whole = _proto_totals(body)
    unchanged = {name for name, _ in fams
                 if _proto_totals(b"".join(m for n, m in fams if n != name)) == whole}
    zero = {f.name + ("_total" if f.type == "counter" else "")
            for f in text_string_to_metric_families(text)
            if all(s.value == 0 for s in f.samples)}
    assert zero == {names.GUARD_MISMATCHED_SERIES, names.WEIGHTS_MISMATCHED_SERIES}  # none planted
    # The weights' mismatch counter at 0 still counts ("checked, none failed" is not "not
    # checked"); the weights' tensor counter is not read into the totals at all.
    # Nor are Ray's serialization seconds, owned bytes, or where its bytes were (their ops'
    # own counters are, and their data seconds).
    assert unchanged == (zero - {names.WEIGHTS_MISMATCHED_SERIES}) | {
        names.OP_DURATION_NATIVE_SERIES, names.ROWS_UNSTAMPED_SERIES, names.WEIGHTS_TENSORS_SERIES,
        names.RAY_SERIALIZATION_SERIES, names.RAY_OWNED_SERIES, names.RAY_MOVED_SERIES,
        names.RAY_REMOTE_SERIES, names.RAY_FETCH_SERIES, names.RAY_NODE_SERIES}
    assert len(fams) > 20


def _family(name: str, kind: int, metrics: list[dict]) -> bytes:
    fam = CLASSES["MetricFamily"](name=name, type=kind)
    for spec in metrics:
        m = fam.metric.add()
        for k, v in spec.pop("labels", {}).items():
            m.label.add(name=k, value=v)
        for field, value in spec.items():
            if field == "histogram":
                for bound, count in value.pop("bucket", []):
                    m.histogram.bucket.add(upper_bound=bound, cumulative_count=count)
                for k, v in value.items():
                    setattr(m.histogram, k, v)
            else:
                getattr(m, field).value = value
    body = fam.SerializeToString()
    return _VarintBytes(len(body)) + body


def test_samples_of_runtime_encoded_families():
    """Counter, gauge, untyped and classic histograms as the runtime encodes them: the +Inf
    bucket is added from the count only when the message leaves it out; a summary and a
    family outside `keep` are skipped."""
    body = b"".join([
        _family("dpobs_a_total", 0, [{"labels": {"op": "get"}, "counter": 3.5}]),
        _family("dpobs_g", 1, [{"gauge": -2.0}, {"labels": {"k": "v"}, "gauge": 0.0}]),
        _family("dpobs_u", 3, [{"untyped": 7.0}]),
        _family("dpobs_h", 4, [{"labels": {"op": "x"}, "histogram": {
            "sample_count": 5, "sample_sum": 0.25, "bucket": [(0.1, 2), (1.0, 4)]}}]),
        _family("dpobs_hinf", 4, [{"histogram": {
            "sample_count": 2, "sample_sum": 9.0, "bucket": [(1.0, 1), (math.inf, 2)]}}]),
        _family("dpobs_s", 2, [{}]),
        _family("other_total", 0, [{"counter": 1.0}]),
    ])
    samples, hists = protobody.decode(body, ("dpobs_",))
    got = {(n, tuple(sorted(labels.items()))): v for n, labels, v in samples}
    assert got == {
        ("dpobs_a_total", (("op", "get"),)): 3.5,
        ("dpobs_g", ()): -2.0, ("dpobs_g", (("k", "v"),)): 0.0,
        ("dpobs_u", ()): 7.0,
        ("dpobs_h_bucket", (("le", "0.1"), ("op", "x"))): 2,
        ("dpobs_h_bucket", (("le", "1.0"), ("op", "x"))): 4,
        ("dpobs_h_bucket", (("le", "+Inf"), ("op", "x"))): 5,
        ("dpobs_h_sum", (("op", "x"),)): 0.25, ("dpobs_h_count", (("op", "x"),)): 5,
        ("dpobs_hinf_bucket", (("le", "1.0"),)): 1, ("dpobs_hinf_bucket", (("le", "+Inf"),)): 2,
        ("dpobs_hinf_sum", ()): 9.0, ("dpobs_hinf_count", ()): 2}
    assert len(samples) == len(got) and hists == {}


# -- the cluster view: one request per endpoint ------------------------------------------
def _counting(exporter, accepts: list, force_text: bool = False):
    """Wrap an exporter's /metrics route: record each request's Accept header; force_text
    answers in text whatever is asked (an endpoint without the protobuf exposition)."""
    served = exporter._metrics

    def route(environ):
        accepts.append(environ.get("HTTP_ACCEPT"))
        if force_text:
            environ = dict(environ, HTTP_ACCEPT="text/plain")
        return served(environ)
    exporter.add_route("/metrics", route)


def _rows(view) -> dict:
    view.step_metrics()
    columns, table = view.breakdown()
    return {r[0]: dict(zip(columns, r)) for r in table}


def test_the_cluster_view_asks_each_endpoint_once_per_call(sd):
    tels = [dpobs.start(role="w", rank=i, job=JOB, port=0, sd_dir=str(sd)) for i in range(3)]
    accepts = [[] for _ in tels]
    try:
        for tel, seen in zip(tels, accepts):
            _counting(tel.exporters[0], seen)
        view = ClusterView(str(sd), JOB)
        for call in range(1, 4):
            for tel in tels:
                for _ in range(50):
                    tel.op_records["get"](0.003)
            got = _rows(view)
            assert [len(a) for a in accepts] == [call] * 3
            assert got["get"]["calls"] == 150 and None not in [got["get"][c] for c in Q]
            assert got["get"]["p50_ms"] == pytest.approx(3.0, rel=0.05)
        assert all(protobuf.wants_protobuf(a) for seen in accepts for a in seen)
    finally:
        for t in tels:
            t.shutdown()


def test_an_endpoint_answering_text_gives_counters_and_no_quantiles(sd):
    new = dpobs.start(role="w", rank=0, job=JOB, port=0, sd_dir=str(sd))
    old = dpobs.start(role="w", rank=1, job=JOB, port=0, sd_dir=str(sd))
    asked = []
    try:
        _counting(old.exporters[0], asked, force_text=True)
        view = ClusterView(str(sd), JOB)
        for tel, op, n in ((new, "get", 40), (old, "put", 30)):
            for _ in range(n):
                tel.op_records[op](0.002)
        got = _rows(view)
        reading = view.source.read()
        seen = {s.labels["rank"]: s for s in reading.processes.values()}
        assert seen["1"].totals.ops["put"].calls == 30 and seen["1"].native is None
        assert set(seen["0"].native) == {"get"}
        assert got["put"]["calls"] == 30 and [got["put"][c] for c in Q] == [None] * 3
        assert got["get"]["calls"] == 40 and None not in [got["get"][c] for c in Q]
        assert len(asked) == 2  # the view's call and the read above: one each
    finally:
        new.shutdown()
        old.shutdown()
