"""The wire-integrity guard: fingerprints travel with the rows, any reader verifies them.

On put, every tensor leaf of the payload gets a digest column beside it, one int64 per row
(`__dpobs_digest__:<field path>`, see fingerprint.py for the function). The columns go through
the data plane with the rows, so a reader in any process, on any later step, recomputes the
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
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

import torch

from . import names
from .fingerprint import (
    NONTENSOR_SENTINEL,
    UNRECORDED_SENTINEL,
    UnsupportedField,
    field_digests,
    id_salts,
)

__all__ = ["WireGuard", "DIGEST_PREFIX", "digest_name", "is_digest_field"]

log = logging.getLogger("dpobs_otel.guard")

DIGEST_PREFIX = "__dpobs_digest__:"

# A corrupted 100k-row read must not turn into 100k log lines: past this many rows per read
# the rest are summarised in one line (the counters carry every row).
MAX_LOG_ROWS_PER_READ = 256


def _escape(part: str) -> str:
    return str(part).replace("%", "%25").replace(".", "%2E")


def digest_name(path) -> str:
    """The reserved top-level column carrying a field's digests (path: str or tuple of str)."""
    if isinstance(path, str):
        path = (path,)
    return DIGEST_PREFIX + ".".join(_escape(p) for p in path)


def is_digest_field(name) -> bool:
    """Is `name` (a str, or a 1-tuple key) one of the guard's reserved digest columns?"""
    if isinstance(name, tuple):
        return len(name) == 1 and is_digest_field(name[0])
    return isinstance(name, str) and name.startswith(DIGEST_PREFIX)


def _label(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _is_non_tensor(value) -> bool:
    try:
        from tensordict import NonTensorData, NonTensorStack
    except ImportError:  # pragma: no cover
        return not isinstance(value, torch.Tensor)
    return isinstance(value, (NonTensorData, NonTensorStack))


def _is_tensordict(value) -> bool:
    from tensordict import TensorDictBase

    return isinstance(value, TensorDictBase) and not _is_non_tensor(value)


def _leaves(td, prefix: tuple = ()) -> Iterable[tuple[tuple, Any]]:
    """(path, value) for every leaf, non-tensor ones included (items(include_nested=True,
    leaves_only=True) silently drops NonTensorData, so this walks items() itself)."""
    for key, value in td.items():
        path = prefix + (key,)
        if _is_tensordict(value):
            yield from _leaves(value, path)
        else:
            yield path, value


class WireGuard:
    """See the module docstring. All public methods swallow their own exceptions."""

    def __init__(self, meter, on_internal_error: Callable[[str, BaseException], None]):
        self._on_internal_error = on_internal_error
        self._recorded = meter.create_counter(
            names.GUARD_RECORDED, unit="{row}",
            description="Rows given a wire fingerprint at put, per field")
        self._checked = meter.create_counter(
            names.GUARD_CHECKED, unit="{row}",
            description="Rows whose wire fingerprint was recomputed and compared at get, per field")
        self._mismatched = meter.create_counter(
            names.GUARD_MISMATCHED, unit="{row}",
            description="Checked rows whose wire fingerprint differed from the writer's, per field")
        self._unverified = meter.create_counter(
            names.GUARD_UNVERIFIED, unit="{row}",
            description="Rows read back without a usable wire fingerprint, per field")
        self._skipped = meter.create_counter(
            names.GUARD_SKIPPED, unit="{field}",
            description="Fields the wire guard could not fingerprint or compare, per reason")
        self._failures = meter.create_counter(
            names.GUARD_FAILURES, unit="{error}",
            description="Exceptions raised inside the wire guard (swallowed), per error type")

    # -- the hooks the core calls -------------------------------------------------------
    is_digest_field = staticmethod(is_digest_field)  # the module function; no state needed

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
                if self.is_digest_field(f):
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
        return self._strip(result)

    # -- put ----------------------------------------------------------------------------
    def _before_put(self, sample_ids, partition_id, fields):
        if not _is_tensordict(fields):
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
        device = fields.device
        ids = {}

        def salts(dev):
            key = str(dev)
            if key not in ids:
                if not ids:
                    ids["cpu"] = id_salts(sample_ids, partition_id)
                ids.setdefault(key, ids["cpu"].to(dev))
            return ids[key]

        for path, value in _leaves(fields):
            if self.is_digest_field(path[0]):
                self._skip("reserved_name")  # a caller-supplied column under our prefix
                continue
            label = _label(path)
            dname = digest_name(path)
            if _is_non_tensor(value) or not isinstance(value, torch.Tensor):
                self._skip("non_tensor")
                out.set(dname, torch.full((n,), NONTENSOR_SENTINEL, dtype=torch.int64,
                                          device=device))
                continue
            try:
                digest = field_digests(value, label, salts(value.device))
            except UnsupportedField as u:
                self._skip(u.reason)
                digest = None
            except Exception as exc:
                self._fail(exc)
                digest = None
            if digest is None:
                # A column is still written, so a select of this field keeps its digests for
                # the other fields; the reader counts these rows unverified.
                out.set(dname, torch.full((n,), UNRECORDED_SENTINEL, dtype=torch.int64,
                                          device=device if device is not None else value.device))
                continue
            out.set(dname, digest)
            self._recorded.add(n, {"field": label})
        return out

    # -- get ----------------------------------------------------------------------------
    def _verify(self, sample_ids, partition_id, result, select_fields, digests_present):
        if result is None or not _is_tensordict(result):
            if result is not None:
                self._skip("not_a_tensordict")
            return
        if len(result.batch_size) == 0:
            self._skip("no_batch_dim")
            return
        n = result.batch_size[0]
        if n == 0:
            return
        top_digests = {k for k in result.keys() if self.is_digest_field(k)}
        selected = None
        if select_fields is not None:
            selected = {f if isinstance(f, tuple) else (f,) for f in select_fields}
        ids_ok = len(sample_ids) == n
        salt_cache: dict[str, torch.Tensor] = {}
        checked_total = mismatched_total = 0
        lines_left = MAX_LOG_ROWS_PER_READ
        suppressed = 0
        for path, value in _leaves(result):
            if len(path) == 1 and path[0] in top_digests:
                continue
            label = _label(path)
            if _is_non_tensor(value) or not isinstance(value, torch.Tensor):
                self._skip("non_tensor")
                continue
            if not digests_present:
                self._unverified.add(n, {"field": label})
                continue
            if selected is not None and not any(path[:len(s)] == s for s in selected):
                # reached through a selector the guard did not add a digest column for
                self._skip("partial_selection")
                self._unverified.add(n, {"field": label})
                continue
            dname = digest_name(path)
            if dname not in top_digests:
                self._unverified.add(n, {"field": label})
                continue
            stored = result.get(dname)
            if (not isinstance(stored, torch.Tensor) or stored.is_nested
                    or tuple(stored.shape) != (n,) or stored.dtype != torch.int64):
                self._skip("digest_malformed")
                self._unverified.add(n, {"field": label})
                continue
            if not ids_ok:
                # rows are not in the order asked: no sample id to salt with
                self._skip("row_count_mismatch")
                self._unverified.add(n, {"field": label})
                continue
            try:
                dev = str(value.device)
                if dev not in salt_cache:
                    base = salt_cache.get("cpu")
                    if base is None:
                        base = salt_cache["cpu"] = id_salts(sample_ids, partition_id)
                    salt_cache[dev] = base.to(value.device)
                computed = field_digests(value, label, salt_cache[dev])
            except UnsupportedField as u:
                self._skip(u.reason)
                self._unverified.add(n, {"field": label})
                continue
            except Exception as exc:
                self._fail(exc)
                self._unverified.add(n, {"field": label})
                continue
            stored = stored.to(computed.device)
            recorded = stored != UNRECORDED_SENTINEL
            diff = (computed != stored) & recorded
            n_rec = int(recorded.sum())
            n_mis = int(diff.sum())
            if n_rec < n:
                self._unverified.add(n - n_rec, {"field": label})
            if n_rec:
                self._checked.add(n_rec, {"field": label})
                checked_total += n_rec
                # Exported from the first check on, at 0 if clean: then the first corrupted
                # row is an increase Prometheus sees, not a series that appears at 1.
                self._mismatched.add(n_mis, {"field": label})
            if n_mis:
                mismatched_total += n_mis
                rows = diff.nonzero().flatten().tolist()
                shown = rows[:max(lines_left, 0)]
                lengths = _row_lengths(value, shown)
                for i, length in zip(shown, lengths):
                    log.error(
                        "dpobs wire guard: fingerprint mismatch: field=%s sample_id=%s row=%d "
                        "row_len=%s partition=%s", label, sample_ids[i], i, length,
                        partition_id)
                lines_left -= len(shown)
                suppressed += len(rows) - len(shown)
        if suppressed:
            log.error("dpobs wire guard: %d more mismatched rows in this read not logged "
                      "(partition=%s); dpobs_guard_rows_mismatched_total counts them all",
                      suppressed, partition_id)
        if checked_total > 1 and mismatched_total == checked_total:
            log.warning(
                "dpobs wire guard: every one of the %d rows checked in this read mismatched "
                "(partition=%s). A divergence this uniform is more likely a bug in the check "
                "(or writer and reader disagreeing on the fingerprint) than corruption on the "
                "wire.", checked_total, partition_id)

    # -- helpers ------------------------------------------------------------------------
    def _strip(self, result):
        try:
            if result is None or not _is_tensordict(result):
                return result
            drop = [k for k in result.keys() if self.is_digest_field(k)]
            return result.exclude(*drop) if drop else result
        except Exception as exc:
            self._fail(exc)
        try:  # last resort: delete in place, so no digest column ever reaches the caller
            for k in [k for k in result.keys() if self.is_digest_field(k)]:
                del result[k]
        except Exception as exc:
            self._fail(exc)
        return result

    def _skip(self, reason: str) -> None:
        self._skipped.add(1, {"reason": reason})

    def _fail(self, exc: BaseException) -> None:
        try:
            self._failures.add(1, {"error_type": type(exc).__name__})
        except Exception:
            pass
        try:
            self._on_internal_error("guard", exc)
        except Exception:
            pass


def _row_lengths(value: torch.Tensor, rows: list[int]) -> list:
    """The leading length of each listed row as read (for the mismatch log line)."""
    try:
        if value.is_nested:
            if value.layout == torch.jagged:
                lengths = value._lengths
                if lengths is None:
                    lengths = value._offsets.diff()
                lengths = lengths.tolist()
                return [lengths[i] for i in rows]
            return [value[i].shape[0] if value[i].dim() else 1 for i in rows]
        return [value.shape[1] if value.dim() > 1 else 1] * len(rows)
    except Exception:
        return ["?"] * len(rows)
