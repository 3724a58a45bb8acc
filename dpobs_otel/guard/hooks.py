"""The wire-integrity guard: fingerprints travel with the rows, any reader verifies them.

On put, every tensor leaf of the payload gets a digest column beside it, one int64 per row
(see columns.py for the names, fingerprint.py for the function). The columns go through the
data plane with the rows, so a reader in any process, on any later step, recomputes the
fingerprints of what it received and compares them with what the writer computed. The guard
keeps no per-row state at all: nothing to leak, nothing to release on clear, nothing lost when
a different process (or a restarted one) does the reading.

Counting rules (every path that declines to check something increments a counter):
    rows.recorded{field}    rows given a digest at put
    rows.checked{field}     rows whose digest was recomputed and compared at get
    rows.mismatched{field}  checked rows whose digest differed (one ERROR log line per row)
    rows.unverified{field}  rows read back with no usable digest: written without the guard,
                            read without the digest column, or unfingerprintable at put.
                            Never counted as clean.
    fields.skipped{reason}  fields the guard could not fingerprint or compare: non_tensor,
                            unsupported_layout, digest_malformed, row_count_mismatch, ...
    failures{error_type}    the guard's own exceptions (swallowed: it never raises into a step)

The counts are plain numbers under one lock, exported by observable counters, the way the
core counts (stats.py); `totals()` hands a copy to per-step loggers.

On an accelerator the host never waits per field or per row: a put's digests stay on the
device in their columns, and a get compares on the device and brings every field's
per-row flags back in one transfer (_settle), from which the counts are made on the host.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from .. import names
from ..shims import torch_jagged
from . import pool
from .columns import (NONTENSOR_SENTINEL, STAMP, UNRECORDED_SENTINEL, digest_name, field_key,
                      is_digest_field, is_non_tensor, is_tensordict, label, leaves,
                      other_version_fields, strip_digests)
from .counts import GuardCounts
from .fingerprint import UnsupportedField, field_digests, id_salts, to_device
from .recover import recover_digests

log = logging.getLogger("dpobs_otel.guard")

# A corrupted 100k-row read must not turn into 100k log lines: past this many rows per read
# the rest are summarised in one line (the counters carry every row).
MAX_LOG_ROWS_PER_READ = 256


class _Salts:
    """The per-row id salts of one call, computed once and copied to each device once."""

    def __init__(self, sample_ids, partition_id):
        self._ids, self._part = sample_ids, partition_id
        self._by_device: dict[str, torch.Tensor] = {}

    def on(self, device) -> torch.Tensor:
        key = str(device)
        got = self._by_device.get(key)
        if got is None:
            cpu = self._by_device.get("cpu")
            if cpu is None:
                cpu = self._by_device["cpu"] = id_salts(self._ids, self._part)
            got = self._by_device[key] = to_device(cpu, device)
        return got


class _ReadTally:
    """What one read found, for its summary log lines."""

    def __init__(self):
        self.checked = self.mismatched = self.suppressed = 0
        self.lines_left = MAX_LOG_ROWS_PER_READ


class WireGuard:
    """See the module docstring. All public methods swallow their own exceptions."""

    is_digest_field = staticmethod(is_digest_field)  # the module function; no state needed

    def __init__(self, meter, on_internal_error: Callable[[str, BaseException], None]):
        self._on_internal_error = on_internal_error
        self.counts = GuardCounts()
        self.counts.register(meter, self._fail)

    def totals(self) -> dict[str, dict[str, int]]:
        """Cumulative counts as plain dicts: recorded, checked, mismatched, unverified (per
        field), skipped (per reason), failures (per error type). A copy; never raises."""
        try:
            return self.counts.snapshot()
        except Exception as exc:
            self._fail(exc)
            return {}

    # -- the hooks the core calls -------------------------------------------------------
    def before_put(self, sample_ids: list[str], partition_id: str, fields):
        if fields is None:
            return None
        try:
            return self._before_put(sample_ids, partition_id, fields)
        except Exception as exc:
            self._fail(exc)
            return fields

    def before_get(self, select_fields):
        if select_fields is None:
            return None  # a full read returns every column, digests included
        try:
            out = list(select_fields)
            have = set(out)
            for f in select_fields:
                if is_digest_field(f):
                    continue
                d = digest_name(f)
                if d not in have:
                    out.append(d)
                    have.add(d)
            return out
        except Exception as exc:
            self._fail(exc)
            return select_fields

    def after_get(self, sample_ids: list[str], partition_id: str, result, select_fields,
                  digests_requested: bool = True):
        try:
            self._verify(sample_ids, partition_id, result, select_fields, digests_requested)
        except Exception as exc:
            self._fail(exc)
        try:
            return strip_digests(result)
        except Exception as exc:
            self._fail(exc)
            return result

    def recover_digests(self, read, sample_ids: list[str], select_fields, result):
        """A select the store refused with the digest columns (KeyError: some rows lack them)
        and the core re-read without: `result` with the digest columns of the rows that have
        them, found by reading just those columns (`read(ids, columns)`, see recover.py), so
        after_get checks those rows and counts only the others unverified. Never raises."""
        try:
            return recover_digests(read, sample_ids, select_fields, result)[0]
        except Exception as exc:
            self._fail(exc)
            return result

    # -- put ----------------------------------------------------------------------------
    def _before_put(self, sample_ids, partition_id, fields):
        if not is_tensordict(fields):
            self._skip("not_a_tensordict")
            return fields
        n = len(sample_ids)
        bs = fields.batch_size
        if len(bs) == 0 or bs[0] != n:
            self._skip("row_count_mismatch")
            return fields
        out = fields.copy()  # shallow: the caller's TensorDict is never mutated
        if len(bs) > 1:
            out.batch_size = bs[:1]  # digest columns are (N,)
        salts = _Salts(sample_ids, partition_id)
        todo = []
        for path, value in leaves(fields):
            if is_digest_field(path[0]):
                if path[0] != STAMP:  # row age's stamp is ours; anything else the caller's
                    self._skip("reserved_name")  # a caller-supplied column under our prefix
                continue
            todo.append((path, value))
        done = _spread(lambda item: self._record(item[0], item[1], salts, n), todo, salts)
        for (path, _), digest in zip(todo, done):
            if digest is not None:
                out.set(digest_name(path), digest)
        return out

    def _record(self, path, value, salts, n):
        """The digest column for one leaf: its digests, or a sentinel column (so a select of
        this field still finds a column; the reader counts these rows unverified)."""
        device = torch_jagged.device(value) if isinstance(value, torch.Tensor) else None
        if is_non_tensor(value) or device is None:
            self._skip("non_tensor")
            return torch.full((n,), NONTENSOR_SENTINEL, dtype=torch.int64)
        field = label(path)
        try:
            digest = field_digests(value, field, salts.on(device))
        except UnsupportedField as u:
            self._skip(u.reason)
            return torch.full((n,), UNRECORDED_SENTINEL, dtype=torch.int64, device=device)
        except Exception as exc:
            self._fail(exc)
            return torch.full((n,), UNRECORDED_SENTINEL, dtype=torch.int64, device=device)
        self.counts.add("recorded", field, n)
        return digest

    # -- get ----------------------------------------------------------------------------
    def _verify(self, sample_ids, partition_id, result, select_fields, digests_present):
        if result is None or not is_tensordict(result):
            if result is not None:
                self._skip("not_a_tensordict")
            return
        if len(result.batch_size) == 0:
            self._skip("no_batch_dim")
            return
        n = result.batch_size[0]
        if n == 0:
            return
        top_digests = {k for k in result.keys() if is_digest_field(k)}
        other_versions = other_version_fields(top_digests)
        selected = None
        if select_fields is not None:
            selected = {f if isinstance(f, tuple) else (f,) for f in select_fields}
        salts = _Salts(sample_ids, partition_id) if len(sample_ids) == n else None
        todo = []
        for path, value in leaves(result):
            if len(path) == 1 and path[0] in top_digests:
                continue
            if is_non_tensor(value) or not isinstance(value, torch.Tensor):
                self._skip("non_tensor")
                continue
            reason = self._why_unverifiable(path, top_digests, other_versions, selected,
                                            digests_present, salts, result, n)
            if reason is not None:
                if reason:
                    self._skip(reason)
                self.counts.add("unverified", label(path), n)
                continue
            todo.append((path, value, result.get(digest_name(path))))
        found = _spread(lambda item: self._check_field(*item, salts), todo, salts)
        tally = _ReadTally()
        for (path, value, _), flags in zip(todo, _settle(found)):
            if flags is not None:
                mismatched = self._count_flags(label(path), *flags)
                tally.checked += mismatched[0]
                tally.mismatched += len(mismatched[1])
                self._log_rows(label(path), value, mismatched[1], tally, sample_ids,
                               partition_id)
        self._summarise(tally, partition_id)

    @staticmethod
    def _why_unverifiable(path, top_digests, other_versions, selected, digests_present, salts,
                          result, n):
        """None if the field can be checked; else the skip reason ("" for none) for counting
        its rows unverified."""
        if not digests_present:
            return ""
        if selected is not None and not any(path[:len(s)] == s for s in selected):
            return "partial_selection"  # reached through a selector we added no digest for
        dname = digest_name(path)
        if dname not in top_digests:
            # a digest of another fingerprint version is never compared: unverified, not wrong
            return "digest_version" if field_key(path) in other_versions else ""
        stored = result.get(dname)
        if (not isinstance(stored, torch.Tensor) or stored.is_nested
                or tuple(stored.shape) != (n,) or stored.dtype != torch.int64):
            return "digest_malformed"
        if salts is None:
            return "row_count_mismatch"  # rows are not in the order asked: no id to salt with
        return None

    def _check_field(self, path, value, stored, salts):
        """Recompute and compare one field (on any of the hook's threads), where its tensor
        lies: None if it could not be checked, else its per-row flags (recorded, differs) as
        one (2, N) bool tensor on that device."""
        field = label(path)
        n = stored.shape[0]
        try:
            computed = field_digests(value, field, salts.on(torch_jagged.device(value)))
        except UnsupportedField as u:
            self._skip(u.reason)
            self.counts.add("unverified", field, n)
            return None
        except Exception as exc:
            self._fail(exc)
            self.counts.add("unverified", field, n)
            return None
        # queued behind the compare on an accelerator; a copy to the CPU must be waited for
        stored = stored.to(computed.device, non_blocking=computed.device.type != "cpu")
        recorded = (stored != UNRECORDED_SENTINEL) & (stored != NONTENSOR_SENTINEL)
        return torch.stack((recorded, (computed != stored) & recorded))

    def _count_flags(self, field, recorded, diff):
        """Count one field's host-side flags: (rows checked, the mismatched rows' indices)."""
        n = recorded.shape[0]
        n_rec, n_mis = int(recorded.sum()), int(diff.sum())
        if n_rec < n:
            self.counts.add("unverified", field, n - n_rec)
        if n_rec:
            # mismatched is exported from the first check on, at 0 if clean: then the first
            # corrupted row is an increase Prometheus sees, not a series that appears at 1.
            self.counts.add("checked", field, n_rec, also=("mismatched", n_mis))
        return n_rec, diff.nonzero().flatten().tolist() if n_mis else []

    @staticmethod
    def _log_rows(field, value, rows, tally, sample_ids, partition_id):
        if not rows:
            return  # a clean field: its row lengths (a device read, for a jagged one) unread
        shown = rows[:max(tally.lines_left, 0)]
        for i, length in zip(shown, _row_lengths(value, shown)):
            log.error("dpobs wire guard: fingerprint mismatch: field=%s sample_id=%s row=%d "
                      "row_len=%s partition=%s", field, sample_ids[i], i, length, partition_id)
        tally.lines_left -= len(shown)
        tally.suppressed += len(rows) - len(shown)

    @staticmethod
    def _summarise(tally, partition_id):
        if tally.suppressed:
            log.error("dpobs wire guard: %d more mismatched rows in this read not logged "
                      "(partition=%s); %s counts them all",
                      tally.suppressed, partition_id, names.GUARD_MISMATCHED_SERIES)
        if tally.checked > 1 and tally.mismatched == tally.checked:
            log.warning(
                "dpobs wire guard: every one of the %d rows checked in this read mismatched "
                "(partition=%s). A divergence this uniform is more likely a bug in the check "
                "(or writer and reader disagreeing on the fingerprint) than corruption on the "
                "wire.", tally.checked, partition_id)

    # -- helpers ------------------------------------------------------------------------
    def _skip(self, reason: str) -> None:
        self.counts.add("skipped", reason, 1)

    def _fail(self, exc: BaseException) -> None:
        try:
            self.counts.add("failures", type(exc).__name__, 1)
        except Exception:
            pass
        try:
            self._on_internal_error("guard", exc)
        except Exception:
            pass


def _spread(fn, items: list, salts: _Salts) -> list:
    """[fn(x) for x in items], largest tensors first over the hook's threads (pool.spread)
    when every tensor is on the CPU; in order on this thread otherwise, so that accelerator
    work stays on the caller's current stream."""
    values = [item[1] for item in items]
    if len(items) < 2 or not all(torch_jagged.device(v).type == "cpu" for v in values
                                 if isinstance(v, torch.Tensor)):
        return [fn(x) for x in items]
    sizes = [_nbytes(v) for v in values]
    if sum(sizes) < pool.SPREAD_MIN_BYTES:
        return [fn(x) for x in items]
    salts.on("cpu")  # once, before the threads that share it
    order = sorted(range(len(items)), key=lambda i: -sizes[i])
    done = pool.spread(fn, [items[i] for i in order])
    out: list = [None] * len(items)
    for i, d in zip(order, done):
        out[i] = d
    return out


def _settle(found: list) -> list:
    """Every field's (2, N) flags on the host, with one device-to-host transfer per device
    for all of a read's fields (none for CPU tensors); None stays None."""
    out = list(found)
    by_device: dict = {}
    for i, flags in enumerate(found):
        if flags is not None and flags.device.type != "cpu":
            by_device.setdefault(flags.device, []).append(i)
    for where in by_device.values():
        flat = torch.cat([found[i].reshape(-1) for i in where]).cpu()  # the one transfer
        sizes = [found[i].numel() for i in where]
        for i, part in zip(where, flat.split(sizes)):
            out[i] = part.view(found[i].shape)
    return out


def _nbytes(value) -> int:
    """A leaf's size, for the order only (0 for anything unusual: never raises)."""
    try:
        if torch_jagged.is_jagged(value):
            return torch_jagged.values(value).nbytes
        return value.nbytes
    except Exception:
        return 0


def _row_lengths(value: torch.Tensor, rows: list[int]) -> list:
    """The leading length of each listed row as read (for the mismatch log line)."""
    try:
        if value.is_nested:
            if value.layout == torch.jagged:
                lengths = torch_jagged.row_lengths(value).tolist()
                return [lengths[i] for i in rows]
            return [value[i].shape[0] if value[i].dim() else 1 for i in rows]
        return [value.shape[1] if value.dim() > 1 else 1] * len(rows)
    except Exception:
        return ["?"] * len(rows)
