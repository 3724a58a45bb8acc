"""Every attribute dpobs records is bounded (dpobs_otel/labels.py), and a process that still
reaches the OpenTelemetry SDK's cardinality limit counts it (component overflow) and says so
once (telemetry.Telemetry._collected)."""
import logging

import pytest
from helpers import scrape, value
from opentelemetry.sdk.metrics.view import View

from dpobs_otel import labels, names, telemetry
from dpobs_otel.guard.counts import GuardCounts

ERRORS = "dpobs_client_operation_errors_total"
OVERFLOW_LABEL = "otel_metric_overflow"


def test_a_bounded_label_keeps_its_first_values_and_calls_the_rest_other():
    bound = labels.Bounded(3)
    assert [bound(v) for v in "abcab"] == list("abcab")
    assert [bound(v) for v in ("d", "a", "e")] == [labels.OTHER, "a", labels.OTHER]


class _RaisesNewClasses:
    """A store whose every get raises an exception class never seen before."""

    def __init__(self):
        self.n = 0

    def get_samples(self, *a, **k):
        self.n += 1
        raise type(f"StoreError{self.n}", (RuntimeError,), {})("down")


def _overflow(s) -> float | None:
    return value(s, "dpobs_instrumentation_errors_total", component=names.COMPONENT_OVERFLOW)


def test_2100_exception_classes_stay_inside_the_error_type_bound(tel):
    """The issue's store: before the bound, 2,001 series and an overflow series nobody
    counted; now the first ERROR_TYPE_LIMIT classes and `other` hold every failure."""
    c = tel.instrument(_RaisesNewClasses())
    for _ in range(2100):
        with pytest.raises(RuntimeError):
            c.get_samples(["a"], "p")
    s = scrape(tel)
    series = {dict(k)["error_type"]: v for (name, k), v in s.items() if name == ERRORS}
    assert len(series) == labels.ERROR_TYPE_LIMIT + 1
    assert series[labels.OTHER] == 2100 - labels.ERROR_TYPE_LIMIT
    assert sum(series.values()) == 2100
    assert series["StoreError1"] == 1
    assert not any(OVERFLOW_LABEL in dict(k) for _, k in s)
    assert _overflow(scrape(tel)) is None


def test_the_guard_bounds_fields_and_its_own_error_types():
    counts = GuardCounts()
    for i in range(labels.FIELD_LIMIT + 10):
        counts.add("checked", f"field{i}", 1, also=("mismatched", 0))
    for i in range(labels.ERROR_TYPE_LIMIT + 5):
        counts.add("failures", f"Error{i}", 1)
    counts.add("skipped", "digest_version", 1)
    snap = counts.snapshot()
    assert len(snap["checked"]) == len(snap["mismatched"]) == labels.FIELD_LIMIT + 1
    assert snap["checked"][labels.OTHER] == 10
    assert snap["failures"][labels.OTHER] == 5
    assert snap["skipped"] == {"digest_version": 1}


# SDKs before 1.39 (the floor's 1.38) keep every label set: nothing folds, nothing to count
SDK_LIMITS = "aggregation_cardinality_limit" in View.__init__.__code__.co_varnames
limited = pytest.mark.skipif(not SDK_LIMITS, reason="this SDK has no cardinality limit")


@limited
def test_an_instrument_past_the_sdks_limit_is_counted_at_every_collection_and_logged_once(
        tel, caplog):
    """Any instrument of the process's provider: one past the default limit of 2000."""
    counter = tel.meter.create_counter("dpobs_test_wide")
    for i in range(2001):
        counter.add(1, {"key": str(i)})
    with caplog.at_level(logging.WARNING, logger="dpobs_otel"):
        s1 = scrape(tel)  # the collection that folds; counted after it
        assert any(OVERFLOW_LABEL in dict(k) for _, k in s1)
        first = _overflow(scrape(tel))
        second = _overflow(scrape(tel))
    assert first is not None and first >= 1
    assert second > first  # still folded: the count keeps rising, and the alert keeps firing
    said = [r for r in caplog.records if "cardinality limit" in r.getMessage()]
    assert len(said) == 1 and "dpobs_test_wide" in said[0].getMessage()


def test_below_the_limit_nothing_is_counted(tel):
    counter = tel.meter.create_counter("dpobs_test_narrow")
    for i in range(100):
        counter.add(1, {"key": str(i)})
    scrape(tel)
    assert _overflow(scrape(tel)) is None


@limited
def test_a_small_limit_on_the_errors_instrument_is_counted(monkeypatch):
    """The op errors instrument itself under a limit of 3 label sets: a fourth error class
    folds, and the count says so."""
    import dpobs_otel as dpobs
    views = telemetry._views
    monkeypatch.setattr(telemetry, "_views", lambda: views() + [
        View(instrument_name=names.OP_ERRORS, aggregation_cardinality_limit=3)])
    tel = dpobs.start(role="test", rank=0, port=0)
    try:
        c = tel.instrument(_RaisesNewClasses())
        for _ in range(3):
            with pytest.raises(RuntimeError):
                c.get_samples(["a"], "p")
        scrape(tel)
        assert _overflow(scrape(tel)) is None  # 3 label sets: at the limit, not past it
        with pytest.raises(RuntimeError):
            c.get_samples(["a"], "p")
        s = scrape(tel)
        assert value(s, ERRORS, **{OVERFLOW_LABEL: "true"}) == 1
        assert _overflow(scrape(tel)) >= 1
    finally:
        tel.shutdown()


@limited
def test_without_the_exporters_hook_the_overflow_is_uncounted_and_said_once(monkeypatch):
    """The public fallback: an exporter whose reader has no _receive_metrics never shows the
    reader a collection; the count is absent, the degradation logged and counted once, and the
    scrape still serves the folded series."""
    import dpobs_otel as dpobs
    from dpobs_otel.shims import otel_sdk
    module, _ = otel_sdk.OWNED["receive_metrics"]
    monkeypatch.setitem(otel_sdk.OWNED, "receive_metrics", (module, "_dpobs_renamed"))
    otel_sdk.reset()
    try:
        tel = dpobs.start(role="test", rank=0, port=0)
        try:
            counter = tel.meter.create_counter("dpobs_test_wide")
            for i in range(2001):
                counter.add(1, {"key": str(i)})
            assert any(OVERFLOW_LABEL in dict(k) for _, k in scrape(tel))
            s = scrape(tel)
            assert _overflow(s) is None
            assert "the cardinality overflow count" in otel_sdk.degradations()
            assert value(s, "dpobs_instrumentation_errors_total",
                         component=names.OTEL_SDK_COMPONENT) >= 1
        finally:
            tel.shutdown()
    finally:
        monkeypatch.undo()
        otel_sdk.reset()
