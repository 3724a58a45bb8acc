"""`dpobs demo --backend transferqueue --store-metrics [--unmeasured ROLE]`: TransferQueue's
own exporter on, announced for file_sd by the measured processes' init (store_metrics.py),
scraped by the demo's Prometheus beside them; the report's section "The store's own
account": per op, where a call's time goes (the client's mean beside the store's seconds
for the requests it makes, controller and storage apart) and coverage, each beside the
workload's own count of who made which calls. --unmeasured ROLE: that role's processes call
the store with the bare client, so the store serves calls dpobs never sees."""
from __future__ import annotations

import dataclasses
import time
from collections import Counter

from .. import names as nm
from ..adapters.transferqueue.exporter import FIRST_RELEASE
from ..adapters.transferqueue.requests import COVERAGE, billed, installed_release
from ..mixin import DEFAULT as MIXIN
from ..readback.scrape import targets
from ..testing.transferqueue import METRICS_COLLECT_S

ROLES = ("rollout", "trainer", "driver")
# The demo's Prometheus holds DpobsUnmeasuredClients this long, not the shipped 15m: a demo
# run lasts a minute or two. Only with --unmeasured: a clean run keeps the shipped hold.
UNMEASURED_FOR = "10s"


def add_store_arguments(p) -> None:
    p.add_argument("--store-metrics", action="store_true",
                   help="TransferQueue's own exporter on (--backend transferqueue): its "
                        "account of every request beside dpobs's, in the report")
    p.add_argument("--unmeasured", choices=ROLES, default=None, metavar="ROLE",
                   help="that role's processes move data without dpobs (with "
                        f"--store-metrics: coverage falls, {nm.ALERT_UNMEASURED_CLIENTS} "
                        f"fires; the demo's Prometheus holds it {UNMEASURED_FOR})")


def store_config(args) -> dict:
    """Config's store fields from the flags, checked."""
    if args.store_metrics and args.backend != "transferqueue":
        raise SystemExit("dpobs demo: --store-metrics needs --backend transferqueue (the "
                         "store with an exporter of its own)")
    if args.store_metrics and installed_release() < FIRST_RELEASE:
        raise SystemExit("dpobs demo: --store-metrics needs TransferQueue >= "
                         f"{'.'.join(map(str, FIRST_RELEASE))} (the first with an exporter)")
    if args.unmeasured and not args.store_metrics:
        raise SystemExit("dpobs demo: --unmeasured needs --store-metrics (only the store's "
                         "own count can tell)")
    return {"store_metrics": args.store_metrics, "unmeasured": args.unmeasured}


def stack_mixin(cfg, base):
    """The demo stack's mixin Config (base: another section's, or None) with this one's hold."""
    if not cfg.unmeasured:
        return base
    return dataclasses.replace(base or MIXIN, unmeasured_for=UNMEASURED_FOR)


def instances(cfg) -> list[str]:
    """The store's exporter as a scrape target (its address), once the processes announced it."""
    if not cfg.store_metrics or not cfg.sd_dir:
        return []
    found = targets(cfg.sd_dir, cfg.job, stores=True)
    return [t.address for t in found if dict(t.labels).get("role") in nm.STORE_ROLES]


def settle(cfg) -> None:
    """Before a scrape that must hold everything so far: the storage units' figures reach the
    exporter one collection late."""
    if cfg.store_metrics:
        time.sleep(2 * METRICS_COLLECT_S)


# -- the workload's own count ---------------------------------------------------------------
def coverage_truth(truth: dict, unmeasured: str | None) -> tuple[dict[str, float], float]:
    """Per covered op and for the job: the measured processes' calls over every process's
    (truth: (role, rank) -> a process's truth), as the rules count them (requests.COVERAGE)."""
    made, served = Counter(), Counter()
    for (role, _), t in truth.items():
        for covered, (ops, _, _) in COVERAGE.items():
            n = sum(len(t["ops"].get(op, ())) for op in ops)
            served[covered] += n
            made[covered] += 0 if role == unmeasured else n
    per_op = {op: made[op] / n for op, n in served.items() if n}
    return per_op, (sum(made.values()) / sum(served.values()) if served else float("nan"))


# -- the section ------------------------------------------------------------------------------
def store_lines(res, stack, cfg) -> list[str]:
    if not cfg.store_metrics:
        return []
    if stack is None:
        return ["\nThe store's own account: needs the demo's Prometheus (--stack auto)"]
    value = _reader(stack)
    lines = ["\nThe store's own account (TransferQueue's exporter) beside dpobs's, per op over "
             "the measured steps (ms per call)",
             f"  {'op':<11}{'client':>9}{'server':>9}{'controller':>12}{'storage':>9}"
             f"{'client side':>13}{'server share':>14}"]
    means = {r["metric"].get("op_type"): r["value"]
             for r in stack.query(nm.JOB_OP_TYPE_STORE_MEAN)}
    for op, made in billed().items():
        client = value(nm.JOB_OP_MEAN, op)
        if client != client:  # no calls of this op in the window
            continue
        ctl = sum(means.get(t, 0.0) for t in made.controller)
        sto = sum(means.get(t, 0.0) for t in made.storage)
        lines.append(f"  {op:<11}{client * 1e3:>9.2f}{(ctl + sto) * 1e3:>9.2f}"
                     f"{ctl * 1e3:>12.2f}{sto * 1e3:>9.2f}{(client - ctl - sto) * 1e3:>13.2f}"
                     f"{value(nm.JOB_OP_STORE_SERVER_SHARE, op):>14.3f}")
    return lines + _coverage_lines(res, cfg, value)


def _coverage_lines(res, cfg, value) -> list[str]:
    per_op, job = coverage_truth(res.truth, cfg.unmeasured)
    who = (f"the {cfg.unmeasured} unmeasured" if cfg.unmeasured else "every process measured")
    lines = [f"\nCoverage ({who}): calls the measured clients made / calls the store served "
             "(truth: the workload's own count of who called)",
             f"  {'op':<11}{'made/s':>9}{'served/s':>10}{'coverage':>10}{'truth':>8}"]
    for op in COVERAGE:
        lines.append(f"  {op:<11}{value(nm.JOB_OP_STORE_MADE, op):>9.2f}"
                     f"{value(nm.JOB_OP_STORE_SERVED, op):>10.2f}"
                     f"{value(nm.JOB_OP_STORE_COVERAGE, op):>10.3f}"
                     f"{per_op.get(op, float('nan')):>8.3f}")
    lines.append(f"  {'job':<11}{'':>19}{value(nm.JOB_STORE_COVERAGE):>10.3f}{job:>8.3f}")
    return lines


def _reader(stack):
    def value(record: str, op: str | None = None) -> float:
        found = stack.query(record if op is None else f'{record}{{op="{op}"}}')
        return found[0]["value"] if found else float("nan")
    return value
