"""Quantiles from classic histogram buckets, as Prometheus's histogram_quantile computes them:
what `dpobs top` and the demo's report read from scraped (or differenced) buckets."""
from __future__ import annotations

import math


def quantile(buckets: dict[float, float], q: float) -> float:
    """histogram_quantile over cumulative buckets {le: count} (Prometheus's linear
    interpolation inside a bucket; the lowest bucket starts at 0). NaN without observations;
    the highest finite bound when the quantile falls in +Inf."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return math.nan
    rank = q * buckets[bounds[-1]]
    lo_b, lo_c = 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            if math.isinf(b):
                return lo_b
            return lo_b + (b - lo_b) * ((rank - lo_c) / (c - lo_c) if c > lo_c else 0.0)
        lo_b, lo_c = b, c
    return lo_b
