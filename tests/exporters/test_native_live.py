"""Native histograms against a real Prometheus 2.x with --enable-feature=native-histograms
(dpobs_otel.testing.prometheus.Central, loopback): what it scrapes through our protobuf
exposition, the native rules promtool 2.42 cannot test (LIVE_CHECKS; tests/mixin/test_rules.py
holds every other rule to a promtool test), cluster quantiles from several processes against
the pooled truth, a process restarting mid-window, and a scraper without the flag."""
from __future__ import annotations

import math
import random
import shutil
import time

import numpy as np
import pytest
from helpers.workload import exercise, series_names

import dpobs_otel as dpobs
from dpobs_otel import names as n
from dpobs_otel.testing.prometheus import Central, rule_files

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="needs the prometheus binary")

# Every rule in mixin.rules.NATIVE_RULES, and the test here that checks its values.
LIVE_CHECKS = {
    n.JOB_OP_NATIVE_QUANTILE: "test_cluster_quantiles_from_several_processes_and_a_restart",
}


def wait_for(check, timeout: float = 40, what: str = ""):
    """Poll check() until it returns something truthy; its last answer otherwise fails."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            assert got, f"timed out waiting for {what}"
            return got
        time.sleep(0.5)


def one(prom, expr: str) -> float | None:
    r = prom.query(expr)
    return r[0]["value"] if r else None


@pytest.fixture
def sd(tmp_path):
    d = tmp_path / "sd"
    d.mkdir()
    return str(d)


def test_protobuf_scrape_keeps_every_series_and_a_flagless_scraper_the_classic(tmp_path, sd):
    tel = dpobs.start(role="live", rank=0, port=0, sd_dir=sd, verify_tensor_hash=True)
    rules = rule_files(tmp_path / "mixin")
    try:
        exercise(tel)
        text_names = series_names(tel, native=False)
        with Central(rules, scrape_sd=sd) as native, \
                Central(rules, scrape_sd=sd, native=False) as classic:
            stored = {}
            for prom in (native, classic):
                wait_for(lambda: one(prom, f"{n.JOB_OP_RATE} >= 0") is not None
                         and one(prom, f"count({n.OP_DURATION_SERIES}_count)"),
                         what=f"{prom.url} scraped and evaluated")
                stored[prom] = {r["metric"]["__name__"] for r in prom.query(
                    'count by (__name__) ({__name__=~"dpobs_.+|target_info"})')}
            assert stored[classic] == text_names
            # The readback client reads a native sample: its count as the value, and the
            # histogram beside it.
            raw = native.query(n.OP_DURATION_NATIVE_SERIES)
            assert raw and all("histogram" in r for r in raw)
            assert {r["metric"]["op"]: r["value"] for r in raw} == {
                r["metric"]["op"]: r["value"] for r in native.query(f"{n.OP_DURATION_SERIES}_count")}
            # Native series, but no observation since the first scrape: no quantile (not NaN).
            assert native.query(n.JOB_OP_NATIVE_QUANTILE) == []
            assert stored[native] == text_names | {n.OP_DURATION_NATIVE_SERIES}
            # The classic histogram through protobuf: +Inf bucket (added by Prometheus) and all.
            for prom in (native, classic):
                assert one(prom, f'sum({n.OP_DURATION_SERIES}_bucket{{le="+Inf"}})') == \
                    one(prom, f"sum({n.OP_DURATION_SERIES}_count)")
            for agg in ("count", "sum"):
                assert one(native, f"sum(histogram_{agg}({n.OP_DURATION_NATIVE_SERIES}))") == \
                    pytest.approx(one(native, f"sum({n.OP_DURATION_SERIES}_{agg})"), rel=1e-9)
            # More ops inside the window: without the flag, the classic rules hold and no
            # native one has anything; with it, both.
            exercise(tel)
            p99 = '{quantile="0.99"}'
            wait_for(lambda: one(classic, f"count({n.JOB_OP_QUANTILE}{p99})"), what="classic")
            wait_for(lambda: one(native, f"count({n.JOB_OP_NATIVE_QUANTILE}{p99})"), what="native")
            assert one(native, f"count({n.JOB_OP_QUANTILE}{p99})")
            assert classic.query(n.JOB_OP_NATIVE_QUANTILE) == []
    finally:
        tel.shutdown()


def _lognormal(rng, median_s: float, sigma: float, count: int) -> list[float]:
    return [math.exp(rng.gauss(math.log(median_s), sigma)) for _ in range(count)]


def _record(tel, values) -> None:
    for v in values:
        tel.op_duration.record(v, tel.op_attrs["get"])


def _check_quantiles(prom, truth: list[float], scraped: int, settle: float = 1) -> dict:
    """The native rules against the pooled truth (what rate() counts in the window), once
    the processes' counts now add to `scraped`; the classic quantiles for the record."""
    wait_for(lambda: one(prom, f"sum(histogram_count({n.OP_DURATION_NATIVE_SERIES}))")
             == scraped, what="every observation scraped")
    time.sleep(settle)  # rule evaluations after that scrape
    errors = {}
    for q in n.QUANTILES:
        want = float(np.quantile(truth, float(q)))
        got = one(prom, f'{n.JOB_OP_NATIVE_QUANTILE}{{op="get",quantile="{q}"}}')
        classic = one(prom, f'{n.JOB_OP_QUANTILE}{{op="get",quantile="{q}"}}')
        errors[q] = (got / want - 1, classic / want - 1)
        assert got == pytest.approx(want, rel=0.05), (q, errors)
    print("native/classic relative error by quantile:", errors)
    return errors


# The native quantiles in the one recording group, and in a group of their own
# (Config.native_quantile_interval) whose `and` reads the op rate the other group recorded.
@pytest.mark.parametrize("knobs", [{}, {"native_quantile_interval": "1s"}], ids=["one", "own"])
def test_cluster_quantiles_from_several_processes_and_a_restart(tmp_path, sd, knobs):
    rng = random.Random(22)
    shapes = [(0.002, 0.5), (0.005, 0.8), (0.001, 0.3)]
    tels = [dpobs.start(role="w", rank=i, port=0, sd_dir=sd) for i in range(3)]
    try:
        for t in tels:  # one observation each, so the series exist before the window's first
            _record(t, [0.002])  # scrape; rate() counts what comes after it
        # Scraped every 200 ms: rate() extrapolates each process's increase by up to an
        # interval at the window's end, so with seconds of data (not 5 minutes) a 1 s interval
        # would weight the processes unevenly by up to ~10% and move the pooled quantiles.
        settle = 2.5 if knobs else 1  # the own group's 1 s cycle after the last scrape
        with Central(rule_files(tmp_path / "mixin", **knobs), scrape_sd=sd,
                     interval="200ms") as prom:
            wait_for(lambda: one(prom, f"count({n.OP_DURATION_NATIVE_SERIES})") == 3,
                     what="three native series")
            time.sleep(0.5)
            truth = []
            for t, (median, sigma) in zip(tels, shapes):
                values = _lognormal(rng, median, sigma, 3000)
                _record(t, values)
                truth += values
            _check_quantiles(prom, truth, scraped=3 + len(truth), settle=settle)
            # Rank 1 restarts on the same port: its counts drop to zero and start again.
            port = int(tels[1].endpoint.rsplit(":", 1)[1])
            tels[1].shutdown()
            tels[1] = dpobs.start(role="w", rank=1, port=port, sd_dir=sd)
            after = _lognormal(rng, 0.02, 0.4, 2000)  # a slower process after the restart
            _record(tels[1], after)
            # rate() absorbs the reset: the window holds rank 1's 3000 before it and its
            # 2000 after, counted from zero in full; its count now is the 2000 alone.
            _check_quantiles(prom, truth + after, scraped=2 * 3001 + len(after), settle=settle)
    finally:
        for t in tels:
            t.shutdown()
