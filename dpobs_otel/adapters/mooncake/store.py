"""A MooncakeDistributedStore with its put / get / remove families measured as the ops
put / get / clear, for code that calls Mooncake directly (`instrument_store`).

The accounting is the core's Account (account.py: the critical path, duration histogram,
calls, keys, bytes, missing rows, occupancy, dpobs's own time), so Mooncake ops land in
exactly the series the protocol's ops do. The guard needs TensorDict rows and has nowhere to
keep digests beside a raw key, so raw keys are measured, not guarded.

What Mooncake reports, and how it is counted:
  * Most failures are negative return codes, not exceptions. A call with any negative code
    counts as one failed operation with error_type="MooncakeError<code>" (e.g.
    "MooncakeError-706": a remove that met a read lease; "-704": not found). The codes are
    Mooncake's ErrorCode enum, a bounded set; anything outside -1..-9999 is "MooncakeError".
    A batch call that partly succeeded also counts the keys and bytes of the items that did.
  * Bytes are payload bytes: a tensor's nbytes, a buffer's nbytes, the `size` of a *_from
    call. Never `get_size`, which includes Mooncake's per-object header.
  * get_tensor's None and get's b'' are a missing key: rows.missing, not an error.
The return value and any exception reach the caller unchanged.
"""
from __future__ import annotations

import re
from operator import attrgetter
from time import perf_counter

import torch

from ...account import Account
from ...sizing import tensor_nbytes
from ..instrumentation import own_calls

__all__ = ["MooncakeError", "InstrumentedMooncakeStore", "instrument_store", "error_type",
           "mooncake_error"]

# The one occupancy "partition" and "field" raw keys live under (Occupancy's vocabulary).
RAW_PARTITION = ""
RAW_FIELD = "value"
NOT_FOUND = -704  # ErrorCode::OBJECT_NOT_FOUND
HAS_LEASE = -706  # ErrorCode::OBJECT_HAS_LEASE
_NAMES = {-1: "INTERNAL_ERROR", -600: "INVALID_PARAMS", -601: "ILLEGAL_CLIENT",
          -704: "OBJECT_NOT_FOUND",
          -705: "OBJECT_ALREADY_EXISTS", -706: "OBJECT_HAS_LEASE", -800: "TRANSFER_FAIL",
          -900: "RPC_FAIL"}


def error_type(code: int) -> str:
    """The bounded error_type label of a Mooncake return code."""
    return f"MooncakeError{code}" if -10000 < code < 0 else "MooncakeError"


class MooncakeError(RuntimeError):
    """A Mooncake call returned a negative code. MooncakeDataPlane raises these through
    `mooncake_error`, whose subclass per code is named by `error_type` ("MooncakeError-706"),
    so the core's error_type label (the exception's class name) carries the code too."""

    def __init__(self, code: int, what: str = ""):
        self.code = code
        self.what = what
        name = _NAMES.get(code, "error")
        super().__init__(f"Mooncake {name} ({code}){': ' + what if what else ''}")

    def __reduce__(self):  # picklable (to a parent process) with its code, not its text
        return mooncake_error, (self.code, self.what)


_ERROR_CLASSES: dict[str, type] = {}


def mooncake_error(code: int, what: str = "") -> MooncakeError:
    """A MooncakeError of the subclass named for `code` (created once per label)."""
    name = error_type(code)
    cls = _ERROR_CLASSES.get(name)
    if cls is None:
        cls = _ERROR_CLASSES[name] = type(name, (MooncakeError,), {"__module__": __name__})
    return cls(code, what)


_NBYTES = attrgetter("nbytes")
_PLAIN = {torch.Tensor}


def _nbytes(v) -> int:
    if type(v) is torch.Tensor:
        return v.nbytes  # logical bytes, whatever the strides (as tensor_nbytes)
    if isinstance(v, torch.Tensor):
        return tensor_nbytes(v)
    return memoryview(v).nbytes


def _sum_nbytes(values) -> int:
    # The common case, plain tensors: two C-level passes, no Python call per value.
    if set(map(type, values)) == _PLAIN:
        return sum(map(_NBYTES, values))
    return sum(map(_nbytes, values))


def _first_error(codes) -> int:
    if isinstance(codes, int):
        return codes if codes < 0 else 0
    if not codes or min(codes) >= 0:
        return 0
    return next(c for c in codes if c < 0)


def _ok_items(keys, codes, good=frozenset({0})):
    """The keys whose code is in `good` (all or none of them without a per-key loop: a
    batch's codes are nearly always one value)."""
    distinct = set(codes)
    if distinct <= good:
        return list(keys)
    if not distinct & good:
        return []
    return [k for k, c in zip(keys, codes) if c in good]


# -- what each measured method names, moves and returns ---------------------------------
# Each reader returns (keys named, read bytes, write bytes, missing, ok keys, error code).
def _put_one(args, rc):
    ok = rc >= 0
    return 1, 0, _nbytes(args[1]) if ok else 0, 0, [args[0]] if ok else [], _first_error(rc)


def _put_parts(args, rc):
    ok = rc >= 0
    return (1, 0, _sum_nbytes(args[1:]) if ok else 0, 0, [args[0]] if ok else [],
            _first_error(rc))


def _put_from(args, rc):
    ok = rc >= 0
    return 1, 0, int(args[2]) if ok else 0, 0, [args[0]] if ok else [], _first_error(rc)


def _put_many(args, rc):
    keys, values = args[0], args[1]
    if isinstance(rc, int):  # put_batch / upsert_batch: one code for the whole batch
        rc = [rc] * len(keys)
    if not rc or min(rc) >= 0:  # the common case, every item stored: no per-item pass
        return len(keys), 0, _sum_nbytes(values), 0, keys, 0
    ok = _ok_items(range(len(keys)), rc, _NON_NEGATIVE(rc))
    return (len(keys), 0, _sum_nbytes([values[i] for i in ok]), 0, [keys[i] for i in ok],
            _first_error(rc))


def _put_many_from(args, rc):
    keys, sizes = args[0], args[2]
    ok = _ok_items(range(len(keys)), rc, _NON_NEGATIVE(rc))
    return (len(keys), 0, sum(int(sizes[i]) for i in ok), 0, [keys[i] for i in ok],
            _first_error(rc))


def _NON_NEGATIVE(codes) -> frozenset:  # noqa: N802  (a set of the codes that succeeded)
    return frozenset(c for c in set(codes) if c >= 0)


def _absent(v) -> bool:
    return v is None or (type(v) is bytes and not v)  # Mooncake stores no empty object


def _get_one(args, out):
    if _absent(out):
        return 1, 0, 0, 1, [], 0
    return 1, _nbytes(out), 0, 0, [], 0


def _get_many(args, out):
    if set(map(type, out)) == _PLAIN:  # every key found, as tensors: one pass to size them
        return len(args[0]), sum(map(_NBYTES, out)), 0, 0, [], 0
    got = [v for v in out if v is not None]
    if got and type(got[0]) is bytes:
        got = [v for v in got if v]
    # max: get_batch([]) answers [b''], one "missing" value for no key asked
    return len(args[0]), _sum_nbytes(got), 0, max(len(args[0]) - len(got), 0), [], 0


def _get_into(args, rc):
    return 1, max(rc, 0), 0, 1 if rc == NOT_FOUND else 0, [], _first_error(rc)


def _get_many_into(args, rc):
    read = sum(c for c in rc if c > 0)
    missing = rc.count(NOT_FOUND)
    return len(args[0]), read, 0, missing, [], _first_error(rc)


_GONE = frozenset({0, NOT_FOUND})  # removed now, or not there to remove


def _remove_one(args, rc):
    return 1, 0, 0, 0, [args[0]] if rc in _GONE else [], _first_error(rc)


def _remove_many(args, rc):
    if not any(rc):  # every key removed
        return len(args[0]), 0, 0, 0, args[0], 0
    return len(args[0]), 0, 0, 0, _ok_items(args[0], rc, _GONE), _first_error(rc)


def _remove_count(args, rc):
    return max(rc, 0), 0, 0, 0, None, _first_error(rc)


_PUT = {"put_tensor": _put_one, "upsert_tensor": _put_one, "pub_tensor": _put_one,
        "upsert_pub_tensor": _put_one, "put": _put_one, "upsert": _put_one,
        "put_parts": _put_parts, "upsert_parts": _put_parts,
        "put_from": _put_from, "upsert_from": _put_from,
        "batch_put_tensor": _put_many, "batch_upsert_tensor": _put_many,
        "batch_pub_tensor": _put_many, "batch_upsert_pub_tensor": _put_many,
        "put_batch": _put_many, "upsert_batch": _put_many,
        "batch_put_from": _put_many_from, "batch_upsert_from": _put_many_from}
_GET = {"get_tensor": _get_one, "get": _get_one, "batch_get_tensor": _get_many,
        "get_batch": _get_many, "get_into": _get_into, "batch_get_into": _get_many_into}
_CLEAR = {"remove": _remove_one, "batch_remove": _remove_many,
          "remove_by_regex": _remove_count, "remove_all": _remove_count}
MEASURED = {**{m: ("put", f) for m, f in _PUT.items()},
            **{m: ("get", f) for m, f in _GET.items()},
            **{m: ("clear", f) for m, f in _CLEAR.items()}}


class InstrumentedMooncakeStore:
    """The store's methods, those in MEASURED timed and counted; everything else untouched."""

    def __init__(self, tel, store):
        self._store = store
        self._tel = tel
        self._acct = Account(tel)  # raw keys: nothing to list, never reconciled

    def __getattr__(self, name):
        store = self.__dict__.get("_store")
        if store is None:
            raise AttributeError(name)
        attr = getattr(store, name)
        spec = MEASURED.get(name)
        if spec is None or not callable(attr):
            return attr
        op, reader = spec

        def measured(*args, **kwargs):
            return self.measure(op, reader, name, attr, args, kwargs)
        measured.__name__ = name
        self.__dict__[name] = measured  # later lookups skip __getattr__
        return measured

    def __repr__(self) -> str:
        return f"InstrumentedMooncakeStore({self._store!r})"

    @property
    def inner(self):
        return self._store

    def measure(self, op, reader, name, fn, args, kwargs):
        """fn(*args, **kwargs), one call of the store's `name`, timed and counted as `op`
        (also MooncakeInstrumentor's, for the methods it patches on the class)."""
        acct = self._acct
        result, t1, t2 = acct.call(op, _own_call, (fn, args, kwargs), {})
        try:
            keys, read, write, missing, ok, code = reader(args, result)
            occupy = ((RAW_PARTITION, ok, {RAW_FIELD: write})
                      if op == "put" and ok else None)
            acct.record_op(op, t2 - t1, keys, read=read, write=write, missing=missing,
                           occupy=occupy, t_end=t2)
            if acct.tracer is not None:
                acct.trace(op, t1, t2, RAW_PARTITION, keys, read + write)
            if op == "clear":
                self._release(name, args, ok, result)
            if code:
                acct.record_error(op, error_type(code))
        except Exception as exc:
            self._tel.internal_error("adapter", exc)
        return result

    def _release(self, name, args, gone, result) -> None:
        """Occupancy: removed keys (and keys already absent) are no longer outstanding."""
        acct = self._acct
        if name == "remove_all":
            if result >= 0:
                acct.release(RAW_PARTITION, None)
            return
        if gone is None:  # remove_by_regex: the keys we know that match, if all went
            pattern = re.compile(args[0])
            matched = [k for k in acct.live_keys(RAW_PARTITION) if pattern.search(k)]
            gone = matched if result >= len(matched) else []
        if gone:
            acct.release(RAW_PARTITION, gone)


def _own_call(fn, args, kwargs):
    with own_calls():  # measured here: MooncakeInstrumentor must not count it again
        return fn(*args, **kwargs)


def instrument_store(tel, store):
    """`store` (a set-up mooncake.store.MooncakeDistributedStore) measured by `tel`: an
    InstrumentedMooncakeStore; with dpobs switched off, `store` itself."""
    return InstrumentedMooncakeStore(tel, store) if tel.enabled else store
