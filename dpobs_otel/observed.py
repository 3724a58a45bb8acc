"""What a collection reads of the core's numbers: one callback per observable instrument of the
core, each a function of (stats, critical) that the op path never calls."""
from __future__ import annotations

import functools

from opentelemetry.metrics import Observation

from . import names


def errors(stats, critical):
    with stats.lock:
        return [Observation(n, {"op": op, "error_type": et})
                for (op, et), n in stats.errors.items()]


def transferred(stats, critical):
    out = []
    with stats.lock:
        for op, s in stats.ops.items():
            if op in names.READ_OPS:
                out.append(Observation(s.read_bytes, {"op": op, "direction": "read"}))
            elif op == "put":
                out.append(Observation(s.write_bytes, {"op": op, "direction": "write"}))
    return out


def keys(stats, critical):
    with stats.lock:
        return [Observation(s.keys, {"op": op}) for op, s in stats.ops.items()]


def missing(stats, critical):
    with stats.lock:
        return [Observation(s.missing, {"op": op}) for op, s in stats.ops.items()
                if op in names.READ_OPS]


def outstanding_size(stats, critical):
    return [Observation(round(stats.outstanding()[0]))]


def outstanding_keys(stats, critical):
    return [Observation(stats.outstanding()[1])]


# Busy and exposed appear with the step histogram, at the first step's end: a series born
# earlier at 0 would count the first step in its rate while the step sum's first sample
# already holds it, and their ratio read high over a short run's window (the figure is in
# docs/development/performance.md, "Time on the critical path").
def busy(stats, critical):
    return [Observation(critical.totals()[0])] if stats.steps else []


def exposed(stats, critical):
    return [Observation(critical.totals()[1])] if stats.steps else []


def instrumentation_time(stats, critical):
    with stats.lock:
        return [Observation(v, {"component": c}) for c, v in stats.instr_seconds.items()]


def instrumentation_errors(stats, critical):
    with stats.lock:
        return [Observation(v, {"component": c}) for c, v in stats.instr_errors.items()]


CORE = {names.OP_ERRORS: errors, names.TRANSFERRED: transferred, names.KEYS: keys,
        names.ROWS_MISSING: missing, names.OUTSTANDING_SIZE: outstanding_size,
        names.OUTSTANDING_KEYS: outstanding_keys, names.STEP_BUSY: busy,
        names.STEP_EXPOSED: exposed, names.INSTR_TIME: instrumentation_time,
        names.INSTR_ERRORS: instrumentation_errors}


def _with_accounts(name, fn, stats, critical):
    """The core's points of `name`, then those of the accounts kept beside it (Ray's ops)."""
    out = fn(stats, critical)
    for account in stats.accounts:
        out.extend(account.observe(name))
    return out


# The instruments other accounts (stats.accounts) add points to.
SHARED = frozenset({names.OP_ERRORS, names.TRANSFERRED, names.KEYS, names.INSTR_TIME})


def core(stats, critical) -> dict:
    """instrument name -> its callback over this Telemetry's stats and critical path."""
    return {name: functools.partial(_with_accounts if name in SHARED else _alone, name, fn,
                                    stats, critical) for name, fn in CORE.items()}


def _alone(name, fn, stats, critical):
    return fn(stats, critical)
