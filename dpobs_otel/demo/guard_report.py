"""The demo report's wire-guard line: the guard's row counts over every process, and why
rows are unverified and fields skipped (guard/hooks.py's counting rules), in words."""
from __future__ import annotations

from .. import names as nm

GUARD = {"recorded": nm.GUARD_RECORDED_SERIES, "checked": nm.GUARD_CHECKED_SERIES,
         "mismatched": nm.GUARD_MISMATCHED_SERIES, "unverified": nm.GUARD_UNVERIFIED_SERIES,
         "fields skipped": nm.GUARD_SKIPPED_SERIES, "failures": nm.GUARD_FAILURES_SERIES}


def guard_line(samples, cfg) -> str:
    """The guard's counts (cfg: the demo's batches.Config), or "off"."""
    if not cfg.verify:
        return "\nWire guard: off (--verify-tensor-hash turns it on)"
    counts = {what: sum(_by(samples, series, "field").values())
              for what, series in GUARD.items()}
    bad = sorted({lab.get("field", "?") for n, lab, v in samples
                  if n == nm.GUARD_MISMATCHED_SERIES and v > 0})
    return ("\nWire guard rows: " + ", ".join(f"{k} {int(v)}" for k, v in counts.items())
            + (f"  (mismatched field: {', '.join(bad)})" if bad else "")
            + _guard_why(samples, counts))


# Why the guard declines a row or a field (guard/hooks.py's counting rules), for the report.
SKIP_REASONS = {
    "non_tensor": "not a tensor (a string or object column: nothing to fingerprint)",
    "unsupported_layout": "a layout the fingerprint cannot read (sparse, ragged past the "
                          "first dimension)",
    "no_batch_dim": "no row dimension", "not_a_tensordict": "the payload is no TensorDict",
    "row_count_mismatch": "rows not in the order asked (no id to salt with)",
    "partial_selection": "read through a selector no digest was added for",
    "digest_version": "written with another fingerprint version",
    "digest_malformed": "its digest column was altered", "reserved_name": "a caller's "
    "column under the guard's prefix"}


def _by(samples, series: str, label: str) -> dict[str, float]:
    """A counter's non-zero values summed per value of `label` (over every process)."""
    out: dict[str, float] = {}
    for name, labels, value in samples:
        if name == series and value > 0:
            key = labels.get(label, "?")
            out[key] = out.get(key, 0.0) + value
    return out


def _guard_why(samples, counts: dict) -> str:
    """Why rows are unverified and fields skipped: per field, per reason, in words."""
    lines = []
    if counts["unverified"]:
        fields = _by(samples, nm.GUARD_UNVERIFIED_SERIES, "field")
        lines.append("  unverified: rows read back with no usable digest (never counted "
                     "clean), because their field was not fingerprinted at put (see the "
                     "skipped fields) or was read without its digest column; by field: "
                     + ", ".join(f"{f} {int(v)}" for f, v in sorted(fields.items())))
    if counts["fields skipped"]:
        reasons = _by(samples, nm.GUARD_SKIPPED_SERIES, "reason")
        lines.append("  fields skipped: fields the guard could not fingerprint or compare, "
                     "counted once per put or get; by reason: " + "; ".join(
                         f"{r} {int(v)}: {SKIP_REASONS.get(r, r)}"
                         for r, v in sorted(reasons.items())))
    return "".join("\n" + line for line in lines)
