"""The instruments' table (names.INSTRUMENTS, created through dpobs_otel/instruments.py) is what
dpobs creates: every instrument a Telemetry makes, with the guard, row age and weights on and
Ray's account beside it, is a row of it and every row is made, with the row's kind, unit and description; every instrument
name has its row and its series; and a callback that fails reaches its on_error and leaves the
collection whole."""
from __future__ import annotations

import pytest
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import Meter, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import dpobs_otel as dpobs
from dpobs_otel import instruments, names
from dpobs_otel.adapters.ray.meter import RayMeter


def _spy_on_meters(monkeypatch) -> list[tuple[str, str, str, str]]:
    """(name, create method, unit, description) of each instrument any SDK Meter creates."""
    made = []
    for method in [m for m in dir(Meter) if m.startswith("create_")]:
        def spy(self, name, *args, _method=method, _original=getattr(Meter, method), **kwargs):
            made.append((name, _method, kwargs.get("unit", ""), kwargs.get("description", "")))
            return _original(self, name, *args, **kwargs)
        monkeypatch.setattr(Meter, method, spy)
    return made


def test_a_telemetry_creates_the_table_and_nothing_else(monkeypatch):
    made = _spy_on_meters(monkeypatch)
    tel = dpobs.start(role="instruments", rank=0, job="instruments", host="127.0.0.1", port=0,
                      verify_tensor_hash=True, row_age=True)
    try:
        assert tel.guard is not None and tel.row_age is not None
        RayMeter(tel)  # what the Ray adapter adds in a process that uses Ray
    finally:
        tel.shutdown()
    assert sorted(made) == sorted((r.name, f"create_{r.kind}", r.unit, r.description)
                                  for r in names.INSTRUMENTS.values())


def test_every_instrument_name_has_its_row_and_its_series():
    constants = {k: v for k, v in vars(names).items()
                 if k.isupper() and isinstance(v, str) and v.startswith("dpobs.")}
    assert set(constants.values()) == set(names.INSTRUMENTS) | set(names.VIEWS)
    for k, v in constants.items():
        assert getattr(names, f"{k}_SERIES") == names.instrument_series(v), k


def _collected(reader) -> dict[str, list]:
    data = reader.get_metrics_data()
    return {m.name: list(m.data.data_points) for rm in data.resource_metrics
            for sm in rm.scope_metrics for m in sm.metrics}


def test_a_failing_callback_reaches_on_error_and_the_rest_is_collected():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    meter = provider.get_meter("t")
    errors = []

    def broken():
        raise RuntimeError("planted")
    try:
        instruments.create(meter, names.OP_ERRORS, broken, errors.append)
        instruments.create(meter, names.KEYS, lambda: [Observation(3)], errors.append)
        got = _collected(reader)
    finally:
        provider.shutdown()
    assert [type(e) for e in errors] == [RuntimeError]
    assert names.OP_ERRORS not in got and [p.value for p in got[names.KEYS]] == [3]


def test_create_takes_a_callback_for_observables_only():
    meter = MeterProvider().get_meter("t")
    with pytest.raises(ValueError):
        instruments.create(meter, names.KEYS)
    with pytest.raises(ValueError):
        instruments.create(meter, names.OP_DURATION, lambda: [], lambda exc: None)


def test_every_histogram_has_a_view_with_fixed_bounds():
    """A histogram without its View gets the SDK's default buckets: they add across
    processes with no one else's, and the bulk records (shims/otel_histogram.py) find bounds
    they were not built for and fall back, counted as a dpobs failure in every process (Ray's
    fetch histogram had none)."""
    from dpobs_otel import telemetry
    viewed = {v._instrument_name for v in telemetry._views()}
    histograms = {row.name for row in names.INSTRUMENTS.values() if row.kind == names.HISTOGRAM}
    assert histograms <= viewed, sorted(histograms - viewed)
