"""Row age at read (`start(row_age=True)` / DPOBS_ROW_AGE=1): how long each row sat in the
store between the put that wrote it and the read that returned it.

A put stamps its rows with the wall clock (int64 nanoseconds since the epoch) in one hidden
column, STAMP. It is named under the guard's reserved prefix on purpose: every path that keeps
the guard's digest columns out of the caller's data, byte counts, field lists and tags (the
core's strip, TransferQueue's tag handling, kv_list, a put's KVBatchMeta) keeps the stamp out
too, and TransferQueue carries it in the very tag entry the guard's digests use (one int64
more in it; digests.py). On a store the protocol wraps it is one more per-row column; Mooncake
keeps it in each row's manifest (its row codec). A rewrite or delta write that stamps replaces
the row's stamp. "%" never starts a real field's key (digest_name escapes it), so the name
cannot collide with a digest column.

A read asks for the column beside the caller's fields, observes each returned row's age
(read time - write time) into the histogram, counts rows without a stamp (no_stamp) and rows
whose age is negative (clock_skew: writer and reader on nodes whose clocks disagree) in
rows.unstamped, and hands the caller the result without the column. Ages across nodes are as
good as the nodes' clocks.

Rows of one put share one stamp, so a read's ages go to the histogram in bulk (_BulkHistogram)
instead of one SDK record per row (several microseconds each).
"""
from __future__ import annotations

import threading
import time
from bisect import bisect_left
from time import perf_counter

import numpy as np
import torch

from . import instruments, names
from .shims.otel_sdk import bulk_add, histogram_aggregations
from .guard.columns import (DIGEST_PREFIX, NONTENSOR_SENTINEL, STAMP, UNRECORDED_SENTINEL,
                            is_tensordict)

STAMP_KEY = STAMP[len(DIGEST_PREFIX):]  # its key in the family (and TransferQueue's entries)
NOT_STAMPED = 0  # what carriers put where a row has no stamp (any value <= 0 reads as none)
_UNSET = min(NONTENSOR_SENTINEL, UNRECORDED_SENTINEL)  # stamps from here up: sentinels
MAX_PROBES = 32  # stamp-only reads per mixed read, at most
_clock = time.time_ns  # module attribute: tests move the wall clock
ENV = "DPOBS_ROW_AGE"  # config.Settings reads it (DPOBS_<setting>); start(row_age=) wins


def stamp_column(n: int, device=None) -> torch.Tensor:
    """n copies of now, the stamp of one put's rows."""
    return torch.full((n,), _clock(), dtype=torch.int64, device=device)


class RowAge:
    """The put and read hooks, the histogram and counts they feed, and the step window.
    Every hook swallows its own errors (counted under component=row_age)."""

    def __init__(self, meter, tel):
        self._tel = tel
        self._lock = threading.Lock()
        self._unstamped: dict[tuple[str, str], int] = {}
        self._window = [0.0, 0.0, 0]  # sum of ages, max age, rows: since step_metrics()
        self._hist = _BulkHistogram(instruments.create(meter, names.ROW_AGE))
        instruments.create(meter, names.ROWS_UNSTAMPED, self._observe_unstamped,
                           instruments.exported(tel.internal_error))

    # -- put ----------------------------------------------------------------------------
    def stamp(self, fields):
        """`fields` with the stamp column (a shallow copy: the caller's TensorDict is never
        mutated); `fields` itself when it cannot carry one."""
        return self._billed(self._stamp, fields, fields)

    @staticmethod
    def _stamp(fields):
        if not is_tensordict(fields) or not fields.batch_dims or not fields.batch_size[0]:
            return fields
        out = fields.copy()
        if fields.batch_dims > 1:
            out.batch_size = fields.batch_size[:1]  # the stamp column is (N,)
        out.set(STAMP, stamp_column(fields.batch_size[0], fields.device))
        return out

    def _billed(self, fn, fallback, *args):
        """fn(*args), its time billed to component=row_age; fallback if it raises."""
        t = perf_counter()
        try:
            return fn(*args)
        except Exception as exc:
            self._tel.internal_error("row_age", exc)
            return fallback
        finally:
            self._tel.stats.add_time("row_age", perf_counter() - t)

    # -- read ---------------------------------------------------------------------------
    @staticmethod
    def select(select_fields):
        """A read's select with the stamp column (None, a full read, returns it anyway)."""
        if select_fields is None or STAMP in select_fields:
            return select_fields
        return [*select_fields, STAMP]

    def observe(self, op: str, result, read, sample_ids, mixed: bool):
        """Observe the ages of a read's rows; returns `result` without the stamp column.
        mixed: the store refused the select with the column (some rows have none) and the
        caller's fields were read alone; the stamps are then found by stamp-only reads
        (`read(ids, columns)`) of halves."""
        out = self._billed(self._observe, None, op, result, read, sample_ids, mixed)
        return self.unstamped(result) if out is None else out  # failed: the caller's columns

    @staticmethod
    def unstamped(result):
        """`result` without the stamp column; never raises (a read whose ages failed)."""
        try:
            return result.exclude(STAMP) if STAMP in result.keys() else result
        except Exception:
            return result

    def _observe(self, op, result, read, sample_ids, mixed):
        if not is_tensordict(result) or not result.batch_dims:
            return result
        n = result.batch_size[0]
        col = result.get(STAMP, None)
        if col is not None:
            result = result.exclude(STAMP)
        elif mixed and len(sample_ids) == n:
            col = _probe(read, list(sample_ids), n)
        if n:
            self._count(op, col, n)
        return result

    def _count(self, op: str, col, n: int) -> None:
        now = _clock()
        if not _well_formed(col, n):
            self._add_unstamped(op, "no_stamp", n)
            return
        stamps = col.cpu().numpy()  # numpy: a few microseconds a call where torch's are tens
        lo, hi = int(stamps.min()), int(stamps.max())
        if lo == hi:  # one put's rows, the usual read: one age for them all
            age = (now - lo) / 1e9
            if not 0 < lo < _UNSET:
                self._add_unstamped(op, "no_stamp", n)
            elif age < 0:
                self._add_unstamped(op, "clock_skew", n)
            else:
                self._aged(op, self._hist.counts_of_one(age, n), age * n, age, age, n,
                           lambda: [age] * n)
            return
        have = (stamps > 0) & (stamps < _UNSET)
        ages = (now - stamps[have]) / 1e9
        skewed = int((ages < 0).sum())
        ages = ages[ages >= 0]
        self._add_unstamped(op, "no_stamp", n - int(have.sum()))
        self._add_unstamped(op, "clock_skew", skewed)
        if len(ages):
            self._aged(op, self._hist.counts_of(ages), float(ages.sum()), float(ages.min()),
                       float(ages.max()), len(ages), ages.tolist)

    def _aged(self, op: str, counts: list, total: float, low: float, top: float,
              rows: int, values) -> None:
        self._hist.add(counts, total, low, top, op, values)
        with self._lock:
            w = self._window
            w[0] += total
            w[1] = max(w[1], top)
            w[2] += rows

    def _add_unstamped(self, op: str, reason: str, rows: int) -> None:
        if rows:
            with self._lock:
                key = (op, reason)
                self._unstamped[key] = self._unstamped.get(key, 0) + rows

    def _observe_unstamped(self):
        from opentelemetry.metrics import Observation
        with self._lock:
            return [Observation(v, {"op": op, "reason": reason})
                    for (op, reason), v in self._unstamped.items()]

    # -- step_metrics -------------------------------------------------------------------
    def window(self) -> dict[str, float]:
        """The step dict's row_age keys since the last call (mean and max only when a row
        was aged: neither is defined over none); resets the window."""
        with self._lock:
            total, top, rows = self._window
            self._window = [0.0, 0.0, 0]
        out = {"dpobs/row_age/rows": rows}
        if rows:
            out["dpobs/row_age/mean_s"] = total / rows
            out["dpobs/row_age/max_s"] = top
        return out


def _well_formed(col, n: int) -> bool:
    return (isinstance(col, torch.Tensor) and not col.is_nested and col.dtype == torch.int64
            and tuple(col.shape) == (n,))


def _probe(read, ids: list, n: int) -> torch.Tensor:
    """The stamps of a mixed read's rows by stamp-only reads: the whole range, then halves of
    each range the store refused (KeyError: a row in it has no stamp), level by level, until
    MAX_PROBES reads, or sooner when neither the whole range nor its halves had a stamp
    (rows nobody stamped: a reader with row age on, writers without). Rows never found:
    NOT_STAMPED."""
    out = torch.full((n,), NOT_STAMPED, dtype=torch.int64)
    level, probes, first, any_ok = [(0, n)], 0, True, False
    while level and probes < MAX_PROBES:
        failed = []
        for lo, hi in level[:MAX_PROBES - probes]:
            probes += 1
            try:
                got = read(ids[lo:hi], [STAMP])
            except KeyError:
                if hi - lo > 1:
                    mid = (lo + hi) // 2
                    failed += [(lo, mid), (mid, hi)]
                continue
            col = got.get(STAMP, None) if is_tensordict(got) else None
            if _well_formed(col, hi - lo):
                out[lo:hi] = col.cpu()
                any_ok = True
        level = failed if any_ok or first else []
        first = False
    return out


class _BulkHistogram:
    """The row-age histogram, fed a read's ages at once. OpenTelemetry's API records one
    value per call; a read of thousands of rows would pay thousands of calls. So the ages are
    bucketed here and added to the SDK's explicit-bucket aggregation for (op) directly, under
    its lock, exactly as that many record() calls would (counts, sum, min, max). That reaches
    into the SDK's internals (otel_sdk.histogram_aggregations and bulk_add, pinned by
    tests/test_rowage.py); wherever they do not look as expected, it falls back to one
    record() per row."""

    def __init__(self, histogram):
        self._h = histogram
        self._bounds = np.array(names.OP_BUCKETS, dtype=np.float64)
        self._attrs: dict[str, dict] = {}
        # op -> its aggregations, found once: with cumulative temporality (the one the
        # readers use; histogram_aggregations refuses the other) the SDK never replaces them
        self._aggs: dict[str, list] = {}

    def counts_of(self, ages: np.ndarray) -> list[int]:
        """Per-bucket counts of ages. searchsorted(side="left") is the SDK's bisect_left: a
        value on a bound is in that bound's bucket (le)."""
        return np.bincount(np.searchsorted(self._bounds, ages, side="left"),
                           minlength=len(self._bounds) + 1).tolist()

    @staticmethod
    def counts_of_one(age: float, n: int) -> list[int]:
        """counts_of n copies of one age."""
        counts = [0] * (len(names.OP_BUCKETS) + 1)
        counts[bisect_left(names.OP_BUCKETS, age)] = n
        return counts

    def add(self, counts: list, total: float, low: float, top: float, op: str,
            values) -> None:
        """As sum(counts) record() calls would: `counts` per bucket, their sum, min (one of
        the values) and max; values() lists the observations, for the fallback."""
        attrs = self._attrs.get(op) or self._attrs.setdefault(op, {"op": op})
        aggs, recorded = self._aggs.get(op), None
        if aggs is None:
            aggs = histogram_aggregations(self._h, attrs, tuple(names.OP_BUCKETS))
        if aggs is None:  # the first record for these attributes creates the aggregation
            self._h.record(low, attrs)
            recorded = low
            counts = list(counts)
            counts[bisect_left(names.OP_BUCKETS, low)] -= 1
            total -= low
            aggs = histogram_aggregations(self._h, attrs, tuple(names.OP_BUCKETS))
        if aggs is not None:
            self._aggs[op] = aggs
        if not aggs:  # internals not as known: one record() per observation
            rest = list(values())
            if recorded is not None:
                rest.remove(recorded)
            for a in rest:
                self._h.record(a, attrs)
            return
        for agg in aggs:
            bulk_add(agg, counts, total, low, top)
