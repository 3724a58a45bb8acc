"""cluster_breakdown's p50_ms, p90_ms, p99_ms against the pooled truth of each window: several
in-process Telemetry objects serving /metrics, latencies recorded with known values, the
driver's view reading them through a file_sd directory. The truth is the window's samples
bucketed at the exporter's schema and interpolated the same way (so equal to float rounding),
and within 5% of numpy's exact sample quantile."""
from __future__ import annotations

import math
import random
import time

import numpy as np
import pytest
from helpers import fakeprom

import dpobs_otel as dpobs
from dpobs_otel.exporters.native_histograms import SCALE, ZERO_THRESHOLD
from dpobs_otel.readback import cluster, native
from dpobs_otel.readback.cluster import ClusterView

JOB = "dpobs-q"
Q = ("p50_ms", "p90_ms", "p99_ms")


def truth(values) -> native.NativeHistogram:
    """The values as the exporter buckets them: (2**((j-1)/16), 2**(j/16)]."""
    h = native.NativeHistogram(SCALE, ZERO_THRESHOLD, count=len(values), sum=sum(values))
    for v in values:
        j = math.ceil(math.log2(v) * 2 ** SCALE)
        h.buckets[j] = h.buckets.get(j, 0) + 1
    return h


def record(tel, op: str, median: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    values = [math.exp(rng.gauss(math.log(median), 0.7)) for _ in range(n)]
    for v in values:
        tel.op_records[op](v)
    return values


def rows(view: ClusterView) -> dict[str, dict]:
    view.step_metrics()
    columns, table = view.breakdown()
    assert columns[-3:] == list(Q) and columns[:9] == [
        "op", "calls", "mean_ms", "max_ms", "mb", "share", "slowest_role", "slowest_rank",
        "slowest_mean_ms"]
    return {r[0]: dict(zip(columns, r)) for r in table}


def assert_quantiles(row: dict, values: list[float]) -> None:
    assert row["calls"] == len(values)
    want = truth(values)
    for col, q in zip(Q, (0.5, 0.9, 0.99)):
        assert row[col] == pytest.approx(1e3 * want.quantile(q), rel=1e-9), col
        assert row[col] == pytest.approx(1e3 * np.quantile(values, q), rel=0.05), col


def start(sd, role: str, rank: int, port: int = 0):
    return dpobs.start(role=role, rank=rank, job=JOB, port=port, sd_dir=str(sd))


def test_window_quantiles_are_the_pooled_windows_samples(sd):
    tels = [start(sd, "trainer", 0), start(sd, "trainer", 1), start(sd, "rollout", 0)]
    try:
        view = ClusterView(str(sd), JOB)
        before = [record(t, "get", 0.004, 500, 10 + i) for i, t in enumerate(tels)]
        got = rows(view)  # since start: everything so far
        assert_quantiles(got["get"], sum(before, []))

        # window 1: different latencies per process; "put" only here
        w1 = [record(t, "get", m, n, 20 + i)
              for i, (t, m, n) in enumerate(zip(tels, (0.002, 0.006, 0.0008), (3000, 800, 1500)))]
        put = record(tels[2], "put", 0.01, 400, 30)
        got = rows(view)
        assert_quantiles(got["get"], sum(w1, []))
        assert_quantiles(got["put"], put)

        # window 2: ten times slower; only its own samples count, and put had no call
        w2 = [record(t, "get", 0.03, 700, 40 + i) for i, t in enumerate(tels)]
        got = rows(view)
        assert_quantiles(got["get"], sum(w2, []))
        assert got["get"]["p50_ms"] > 10 * 1e3 * np.quantile(sum(w1, []), 0.5)
        assert got["put"]["calls"] == 0 and [got["put"][c] for c in Q] == [None] * 3

        # the demo's report line shows p99
        text = cluster.text({}, view.breakdown())
        assert "p99_ms" in text.splitlines()[1] and format(got["get"]["p99_ms"], ".4g") in text
    finally:
        for t in tels:
            t.shutdown()


def test_a_restarted_process_counts_from_its_restart(sd):
    a, b = start(sd, "trainer", 0), start(sd, "trainer", 1)
    port = int(b.endpoint.rpartition(":")[2])
    try:
        view = ClusterView(str(sd), JOB)
        record(a, "get", 0.002, 300, 1)
        record(b, "get", 0.002, 300, 2)
        rows(view)
        kept = record(a, "get", 0.003, 1000, 3)
        record(b, "get", 0.5, 2000, 4)  # lost with b's first incarnation
        b.shutdown()
        b = start(sd, "trainer", 1, port=port)  # the same process key: same host:port
        since = record(b, "get", 0.001, 200, 5)  # fewer than before: counters went back
        got = rows(view)
        assert view.last.restarted == 1
        assert_quantiles(got["get"], kept + since)
        later = record(b, "get", 0.02, 600, 6)
        assert_quantiles(rows(view)["get"], later)  # differenced against the new incarnation
    finally:
        a.shutdown()
        b.shutdown()


def test_a_process_without_a_native_window_blanks_the_quantiles(sd, monkeypatch):
    """An answer in text (no native histograms in it) leaves the op's quantiles None for
    that call and the next (no baseline to difference against), never a quantile over some
    of the calls."""
    a, b = start(sd, "trainer", 0), start(sd, "trainer", 1)
    get = native.get
    try:
        view = ClusterView(str(sd), JOB)
        rows(view)
        record(a, "get", 0.002, 300, 1)
        record(b, "get", 0.004, 300, 2)

        def text_from_b(address, accept, *args, **kw):
            return get(address, "text/plain" if address == b.endpoint else accept, *args, **kw)
        monkeypatch.setattr(native, "get", text_from_b)
        got = rows(view)
        assert got["get"]["calls"] == 600 and [got["get"][c] for c in Q] == [None] * 3
        monkeypatch.setattr(native, "get", get)
        record(b, "get", 0.004, 300, 3)
        got = rows(view)  # counters differenced; b's histogram has no baseline yet
        assert got["get"]["calls"] == 300 and [got["get"][c] for c in Q] == [None] * 3
        values = record(a, "get", 0.002, 300, 4) + record(b, "get", 0.004, 300, 5)
        assert_quantiles(rows(view)["get"], values)
    finally:
        a.shutdown()
        b.shutdown()


class FakePrometheus(fakeprom.QueryAPI):
    """One process whose get count grows by 10 per query of the series."""
    calls = [0]

    def vector(self, q):
        m = {"job": JOB, "instance": "h:1", "role": "w", "rank": "0"}
        now = time.time()
        if q.startswith("timestamp(up"):
            return [{"metric": m, "value": [now, str(now)]}]
        if q.startswith("up{"):
            return [{"metric": dict(m, __name__="up"), "value": [now, "1"]}]
        self.calls[0] += 10
        op = dict(m, op="get")
        return [{"metric": dict(op, __name__=f"dpobs_client_operation_duration_seconds{s}"),
                 "value": [now, str(v)]}
                for s, v in (("_count", self.calls[0]), ("_sum", self.calls[0] * 0.01))]


def test_a_prometheus_source_has_no_quantiles():
    with fakeprom.serving(FakePrometheus) as url:
        view = ClusterView(url, JOB)
        rows(view)
        got = rows(view)["get"]
        assert got["calls"] == 10 and got["mean_ms"] == pytest.approx(10.0)
        assert [got[c] for c in Q] == [None] * 3
