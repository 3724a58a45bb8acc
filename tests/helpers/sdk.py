"""What the installed OpenTelemetry SDK offers dpobs's fast paths (otel_sdk.py)."""
from __future__ import annotations

from dpobs_otel.shims import otel_sdk

N = otel_sdk.NAMES


def knows_fast_paths(histogram) -> bool:
    """Does this SDK have the two names the bound record and the row-age bulk add need that
    1.38 lacks (an instrument's _is_enabled, a view match's _reset_on_collect)? Without them
    each value takes record()."""
    consumer = getattr(histogram, N["consumer"])
    storage = next(iter(getattr(consumer, N["storages"]).values()))
    match = getattr(storage, N["matches_init"])(histogram)[0]
    return hasattr(histogram, N["is_enabled"]) and hasattr(match, N["reset_on_collect"])
