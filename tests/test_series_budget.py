"""Series per endpoint, per client kind, inside the budget docs/development/scaling.md states
("Series per endpoint"): each kind's process runs the stated mix of ops and its /metrics is
counted as a scrape counts it (scrape_samples_scraped: every sample, target_info and each
histogram bucket included). A change that grows a kind past its budget fails here, and the
budget and the capacity figures that rest on it are to be redone together."""
from __future__ import annotations

import pytest
from helpers import scrape

import dpobs_otel as dpobs
from dpobs_otel.testing import series_mix

# kind -> samples per scrape at most (docs/development/scaling.md, "Series per endpoint")
# (measured: 155, 196, 532, 448, 45, 49 with Ray's data time and locality; the budget leaves
# about 5%)
BUDGET = {"data-plane client": 165, "data-plane client, row age": 205, "Ray driver": 560,
          "Ray worker": 470, "weight sender": 48, "weight receiver": 52}
STEPS = 3


def series(kind: str) -> int:
    tel = dpobs.start(role="budget", rank=0, port=0, **series_mix.SETTINGS[kind])
    try:
        ctx = series_mix.context(tel, kind)
        for step in range(STEPS):
            series_mix.STEP[kind](tel, ctx, step)
        return len(scrape(tel))
    finally:
        tel.shutdown()


def test_the_budget_names_every_kind_of_the_mix():
    assert set(BUDGET) == set(series_mix.STEP) == {k for k, _ in series_mix.MIX}


@pytest.mark.parametrize("kind", sorted(BUDGET))
def test_series_per_endpoint_stay_inside_the_budget(kind):
    assert series(kind) <= BUDGET[kind], (kind, BUDGET[kind])
