"""The report's queue lines (`dpobs demo --async K --row-age`): who waits for whom, from each
process's /metrics (readback/verdict.py, thresholds and roles from the mixin's Config), and
the row age the trainers observed beside the workload's own clock (asynchronous.py)."""
from __future__ import annotations

from .. import names as nm
from ..readback import verdict as v
from ..readback.buckets import quantile  # histogram_quantile over cumulative buckets
from .flags import at_least


def add_queue_arguments(p) -> None:
    p.add_argument("--async", type=at_least(0), default=0, metavar="K", dest="async_k",
                   help="no barrier between the rollout and the trainers: the rollout runs up "
                        "to K steps ahead, trainers wait for their rows inside tel.waiting()")
    p.add_argument("--row-age", action="store_true",
                   help="rows carry their write time; reads observe their age "
                        "(dpobs.start(row_age=True))")


def check_queue(args) -> None:
    if args.async_k < 0 or (args.async_k and args.prefetch):
        raise SystemExit("dpobs demo: --async K needs K >= 1, and replaces --prefetch")


def row_age_truth(res, keys) -> tuple[float, float, int]:
    """(mean lower bound, mean upper bound, rows) of the true ages, every step."""
    lo = hi = rows = 0
    for k in keys:
        for t in (res.warm[k], res.truth[k]):
            a = t.get("row_age")
            if a:
                lo, hi, rows = lo + a[0], hi + a[1], rows + a[2]
    return (lo / rows, hi / rows, rows) if rows else (float("nan"), float("nan"), 0)


def metric_row_age(samples) -> tuple[float, float, float, float]:
    """(mean, p50, p99, rows) of the row-age histogram summed over processes."""
    total = rows = 0.0
    buckets: dict[float, float] = {}
    for name, labels, value in samples:
        if name == nm.ROW_AGE_SERIES + "_sum":
            total += value
        elif name == nm.ROW_AGE_SERIES + "_count":
            rows += value
        elif name == nm.ROW_AGE_SERIES + "_bucket":
            le = float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + value
    mean = total / rows if rows else float("nan")
    if not rows:
        return mean, float("nan"), float("nan"), rows
    return mean, quantile(buckets, 0.5), quantile(buckets, 0.99), rows


def queue(res) -> v.Queue:
    return v.from_processes([(k[0], v.counts(res.scraped[k])) for k in res.info])


def queue_lines(res, cfg) -> list[str]:
    lines = ["\nWho waits for whom: " + v.verdict(queue(res))]
    if not cfg.row_age:
        return lines + ["Row age: off (--row-age turns it on)"]
    trainers = [k for k in res.info if k[0] == "trainer"]
    mean, p50, p99, rows = metric_row_age([s for k in trainers for s in res.scraped[k]])
    lo, hi, true_rows = row_age_truth(res, trainers)
    lines.append(f"Row age at read, trainers, every step: metrics mean {mean * 1e3:.1f} ms "
                 f"(p50 {p50 * 1e3:.1f}, p99 {p99 * 1e3:.1f}, {int(rows)} rows) | truth (the "
                 f"workload's wall clock around each put and read) mean between "
                 f"{lo * 1e3:.1f} and {hi * 1e3:.1f} ms ({true_rows} rows); dpobs stamps as "
                 "the put starts and ages as the read returns: near the upper bound")
    return lines
