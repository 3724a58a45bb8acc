"""`dpobs compare`: the same GRPO workload on each data plane, side by side.

Each backend runs as its own job, `dpobs-<backend>`, one after the other, all scraped by one
private Prometheus with the mixin's recording rules. While a backend's processes are still
up (and Prometheus has evaluated their final state) the table's numbers are read from the
recording rules of that job; the workload's own truth of the measured steps stands beside
each figure in parentheses. Rates are over the rules' 5m windows, which for a short run
cover the whole run from the post-warm-up scrape, so ratios (means, shares, bytes per call,
fractions) compare with the truth of the measured steps.

rate() extrapolates each series by up to half a scrape interval before its first sample and
one after its last, and each process is scraped at its own offset, so a ratio of two
processes' rates (an op's share, when rollouts put and trainers get) can be off by about
1.5 intervals over the span the series were sampled, and a short run's series live a
few seconds (how far off 1 s scrapes read: docs/development/performance.md, "dpobs
compare"). So `dpobs compare` scrapes every 250 ms
and, after the run, holds its processes (idle: their counters no longer move) until every
series has SETTLE samples, which bounds that error near 1.5 / (SETTLE - 1) = 5%.

Where a backend's store exporter is scraped (TransferQueue's, registered as the job's
`tq-controller` target), the table adds the store's own account: the server share and the
coverage per op, as `dpobs top` reads them (top/store.py). compare itself does not turn that
exporter on (`dpobs demo --backend transferqueue --store-metrics` does).
"""
from __future__ import annotations

import sys
import time

from ..names import (INSTANCE_FRAC_OF_STEP, INSTR_TIME_SERIES, JOB_BUSY_FRAC_OF_STEP,
                     JOB_EXPOSED_FRAC_OF_STEP, JOB_FRAC_OF_STEP, JOB_MAX_EXPOSED_FRAC_OF_STEP,
                     JOB_OP_MEAN, JOB_OP_NATIVE_QUANTILE, JOB_OP_QUANTILE, JOB_OP_SHARE,
                     JOB_OVERHEAD_RATIO, OP_DURATION_SERIES, TRANSFERRED_SERIES)
from .backends import BACKENDS, BackendUnavailable, available, start_failure
from .batches import Config
from .logs import BackendLog, log_dir
from .progress import Progress
from .critical import fractions
from .report import STACK_PACKAGES, frac_of_step, merge, op_shares, quantile, session
from ..testing.stack import Stack, StackError, binaries
from ..top import store

INTERVAL = "250ms"  # the private Prometheus's scrape and evaluation interval
SETTLE = 31  # samples every op series has before the rules are read
# --verify-tensor-hash runs every backend with the guard on, and it has none on Ray's plane.
VERIFY_RAY = "--verify-tensor-hash: the guard does not ride Ray's object store"
ROWS = ("calls", "mean ms", "p50 ms", "p99 ms", "bytes/call", "share")


def _backends(spec: str, verify: bool = False) -> list[str]:
    names = [b.strip() for b in spec.split(",") if b.strip()]
    bad = [b for b in names if b not in BACKENDS]
    if bad:
        raise SystemExit(f"dpobs compare: unknown backend(s) {', '.join(bad)}; "
                         f"one of {', '.join(BACKENDS)}")
    usable = []
    for b in names:
        why = available(b) or (VERIFY_RAY if verify and b == "ray" else None)
        if why:
            print(f"dpobs compare: skipping {b} ({why})", file=sys.stderr)
        else:
            usable.append(b)
    return usable


def measure(stack: Stack, cfg: Config, err=None) -> dict:
    """Run one backend; its answers from the rules, and the truth, while its processes live.
    Its header and progress line go to `err` (default: sys.stderr)."""
    def one(expr: str) -> float:
        r = stack.query(expr)
        return r[0]["value"] if r else float("nan")

    job = f'job="{cfg.job}"'
    err = sys.stderr if err is None else err
    print(f"== {cfg.backend}: {cfg.steps} measured steps as job {cfg.job}", file=err)
    progress = Progress(cfg, stream=err)
    with session(cfg, stack, None, progress) as res:
        progress.finish()
        samples = _settle(stack, job)
        truth = merge(res.truth.values())
        counted = merge([*res.warm.values(), *res.truth.values()])  # what counters hold
        ops, shares = {}, op_shares(truth)
        # Every op's share from one query, one evaluation: a query per op could straddle a
        # rule evaluation, and shares of two evaluations summed to 1.00005 once.
        recorded = {r["metric"].get("op"): r["value"]
                    for r in stack.query(f"{JOB_OP_SHARE}{{{job}}}")}
        for op, d in truth["ops"].items():
            sel = f'{{{job},op="{op}"}}'
            nbytes = sum(n for (o, _), n in truth["bytes"].items() if o == op)
            ops[op] = {
                "calls": (one(f"sum({OP_DURATION_SERIES}_count{sel})"),
                          len(counted["ops"][op])),
                "mean ms": (1e3 * _mean(one, sel), 1e3 * d.total / len(d)),
                "p50 ms": (_q(one, sel, "0.5"), 1e3 * quantile(d, 0.5)),
                "p99 ms": (_q(one, sel, "0.99"), 1e3 * quantile(d, 0.99)),
                "bytes/call": (one(_bytes_per_call(sel)), nbytes / len(d)),
                "share": (recorded.get(op, float("nan")), _truth_share(cfg, shares, op)),
            }
        roles, whole = {}, {"share": op_shares(counted), "roles": {}}
        for role in sorted({r for r, _ in res.truth}):
            t = merge(v for (r, _), v in res.truth.items() if r == role)
            roles[role] = (one(f'avg({INSTANCE_FRAC_OF_STEP}{{{job},role="{role}"}})'),
                           frac_of_step(t))
            whole["roles"][role] = frac_of_step(merge(
                v for (r, _), v in [*res.warm.items(), *res.truth.items()] if r == role))
        whole["critical"] = dict(zip(("busy", "exposed"), fractions(counted)[1:]))
        overall = (one(f"{JOB_FRAC_OF_STEP}{{{job}}}"), frac_of_step(truth))
        _, busy, exposed = fractions(truth)  # None until the workload keeps that clock
        critical = {"busy": (one(f"{JOB_BUSY_FRAC_OF_STEP}{{{job}}}"), busy),
                    "exposed": (one(f"{JOB_EXPOSED_FRAC_OF_STEP}{{{job}}}"), exposed),
                    "most stalled": (one(f"{JOB_MAX_EXPOSED_FRAC_OF_STEP}{{{job}}}"), None)}
        own = one(f"{JOB_OVERHEAD_RATIO}{{{job}}}")
        # The guard's part of that own time, both rates from one query: dividing by the
        # recorded op rate instead mixed two evaluation instants, and a short run's moving
        # window then put the guard above the whole it belongs to (0.2292 > 0.2274 once).
        guard = own * one(f'sum(rate({INSTR_TIME_SERIES}{{{job},component="guard"}}[5m]))'
                          f' / sum(rate({INSTR_TIME_SERIES}{{{job}}}[5m]))') if cfg.verify else None
    # The truth with the warm-up step too: a short run's 5m window holds part of it, so the
    # rules' ratios lie between the measured steps' truth and this one.
        share_sum = sum(recorded.values())
        account = _store(stack, cfg.job)
    return {"ops": ops, "roles": roles, "frac": overall, "critical": critical,
            "own": own, "guard": guard, "quantiles": _source(one, job),
            "with_warmup": whole, "samples": samples, "share_sum": share_sum,
            "store": account}


def _truth_share(cfg: Config, shares: dict, op: str) -> float | None:
    """The op's share of the truth's data-plane time; none for Ray's, whose rule is of every
    process's data time (the workers' arguments and returns too), which the driver's own
    timers cannot give."""
    return None if cfg.backend == "ray" else shares.get(op, 0.0)


def _store(stack: Stack, job: str) -> dict[tuple[str, str], float]:
    """(row, op) -> value of the store's own account for `job` ('server share' and
    'coverage' rows, as `dpobs top` reads them); empty where its exporter is not scraped."""
    lines = store.from_prometheus(
        lambda expr: [(r["metric"], r["value"]) for r in stack.query(expr)])
    out = {}
    for s in (s for s in lines if s.job == job):
        for row, value in (("server share", s.server_share), ("coverage", s.coverage)):
            if value is not None:
                out[(row, s.op)] = value
    return out


def _mean(one, sel: str) -> float:
    """The op's mean from its rule; a Ray op's, which the rule leaves out with the data plane's
    seconds (DESIGN.md), from its series: both rates in one query."""
    mean = one(f"{JOB_OP_MEAN}{sel}")
    if mean == mean:
        return mean
    return one(f"sum(rate({OP_DURATION_SERIES}_sum{sel}[5m]))\n"
               f"  / sum(rate({OP_DURATION_SERIES}_count{sel}[5m]))")


def _bytes_per_call(sel: str) -> str:
    """The bytes' rate over the op rate, both in one query. Dividing the two recorded rules
    let a scrape committed between their evaluations move one rate and not the other (with
    the processes idle, a new sample still moves rate()'s extrapolation): bytes per call came
    out 30/31 of the truth once (59,006 for 60,973). One query reads one set of samples, and
    a process's two counters share their scrapes, so the ratio is the counters' own."""
    return (f"sum by (job, op) (rate({TRANSFERRED_SERIES}{sel}[5m]))\n"
            f"  / sum by (job, op) (rate({OP_DURATION_SERIES}_count{sel}[5m]))")


def _settle(stack: Stack, job: str, timeout: float = 120) -> float:
    """Wait until every op series of `job` has SETTLE samples in the rules' window, then for
    an evaluation after that; the fewest samples any has (SETTLE or more)."""
    expr = f"min(count_over_time({OP_DURATION_SERIES}_count{{{job}}}[5m]))"
    deadline = time.monotonic() + timeout
    while True:
        r = stack.query(expr)
        if r and r[0]["value"] >= SETTLE:
            break
        if time.monotonic() > deadline:
            raise StackError(f"{job}: op series have {r[0]['value'] if r else 0} samples "
                             f"after {timeout:.0f} s, {SETTLE} wanted")
        time.sleep(0.1)
    stack.wait_evaluated(after=time.time())
    return r[0]["value"]


def _q(one, sel: str, q: str) -> float:
    """ms from the native histogram's rule, or the classic one where it has no value (a
    Prometheus without native histograms); QUANTILE_SOURCE names the one the table shows."""
    sel = sel[:-1] + f',quantile="{q}"}}'
    native = one(f"{JOB_OP_NATIVE_QUANTILE}{sel}")
    return 1e3 * (native if native == native else one(f"{JOB_OP_QUANTILE}{sel}"))



def _source(one, job: str) -> str:
    """Which histogram the job's p50/p99 cells come from."""
    native = one(f"count({JOB_OP_NATIVE_QUANTILE}{{{job}}})")
    if native != native:
        return "classic"
    return "native" if native == one(f"count({JOB_OP_QUANTILE}{{{job}}})") else "mixed"


def _cell(pair, fmt: str) -> str:
    """'rules (truth)'; '-' for a rule without a series (no bytes move on list or clear),
    and no parentheses where the workload has no truth for it."""
    rules, truth = pair
    if rules != rules:  # NaN
        return "-"
    return fmt.format(rules) + ("" if truth is None else f" ({fmt.format(truth)})")


FORMATS = {"calls": "{:.0f}", "mean ms": "{:.2f}", "p50 ms": "{:.1f}", "p99 ms": "{:.1f}",
           "bytes/call": "{:.0f}", "share": "{:.1%}"}


def table(results: dict[str, dict]) -> str:
    """One column per backend; each cell 'rules (truth)'."""
    names = list(results)
    width = 26
    head = f"  {'':<22}" + "".join(f"{n:>{width}}" for n in names)
    lines = ["\nBackends side by side: each cell is recording rules (workload truth)", head]
    lines.append(f"  {'quantiles from':<22}" + "".join(
        f"{results[n]['quantiles']:>{width}}" for n in names))
    ops = sorted({op for r in results.values() for op in r["ops"]},
                 key=lambda op: -max(r["ops"].get(op, {}).get("share", (0, 0))[1] or 0
                                     for r in results.values()))
    for op in ops:
        lines.append(f"  {op}")
        for row in ROWS:
            cells = [_cell(results[n]["ops"][op][row], FORMATS[row])
                     if op in results[n]["ops"] else "-" for n in names]
            lines.append(f"    {row:<20}" + "".join(f"{c:>{width}}" for c in cells))
    lines.append("  frac_of_step")
    for role in sorted({r for res in results.values() for r in res["roles"]}):
        cells = [_cell(results[n]["roles"][role], "{:.1%}") if role in results[n]["roles"]
                 else "-" for n in names]
        lines.append(f"    {role:<20}" + "".join(f"{c:>{width}}" for c in cells))
    lines.append(f"    {'job':<20}" + "".join(
        f"{_cell(results[n]['frac'], '{:.1%}'):>{width}}" for n in names))
    lines.append("  fractions of step time, job (op-seconds is frac_of_step above)")
    for what in ("busy", "exposed", "most stalled"):
        lines.append(f"    {what:<20}" + "".join(
            f"{_cell(results[n]['critical'][what], '{:.1%}'):>{width}}" for n in names))
    lines.append(f"  {'dpobs own time / op time':<22}" + "".join(
        f"{_cell((results[n]['own'], None), '{:.2%}'):>{width}}" for n in names))
    if any(r["guard"] is not None for r in results.values()):
        lines.append(f"  {'guard time / op time':<22}" + "".join(
            f"{results[n]['guard']:>{width}.2%}" for n in names))
    return "\n".join(lines + _store_lines(results, width))


# The store's own account's rows: what each heading's cells are.
STORE_ROWS = {"server share": "server share (the store's seconds / the client's)",
              "coverage": "coverage (calls measured clients made / calls the store served)"}


def _store_lines(results: dict[str, dict], width: int) -> list[str]:
    """The store's own account: under each heading an op per line that some backend has;
    nothing when no backend's store exporter was scraped."""
    got = [r.get("store", {}) for r in results.values()]
    out = []
    for row, heading in STORE_ROWS.items():
        ops = sorted({op for g in got for r, op in g if r == row},
                     key=lambda op: (op == store.ALL_OPS, op))
        out += [f"  {heading}"] if ops else []
        for op in ops:
            cells = [_cell((g.get((row, op), float("nan")), None), "{:.1%}") for g in got]
            out.append(f"    {op:<20}" + "".join(f"{c:>{width}}" for c in cells))
    return out


def collect(args) -> dict[str, dict]:
    """measure() of every backend `args` names that can run here, in one private Prometheus."""
    names = _backends(args.backends, args.verify_tensor_hash)
    if not names:
        raise SystemExit("dpobs compare: no backend can run here")
    missing = [n for n, p in binaries().items() if p is None]
    if missing:
        raise SystemExit(f"dpobs compare: needs {', '.join(missing)} on PATH (apt install "
                         f"{STACK_PACKAGES})")
    logs = log_dir(args.log_dir)
    with Stack(interval=INTERVAL) as stack:
        print(f"Prometheus {stack.prometheus}", file=sys.stderr)

        def one(name: str) -> dict:
            cfg = Config(steps=args.steps, trainers=args.trainers, batch_size=args.batch_size,
                         latency_s=args.store_latency_ms / 1e3, verify=args.verify_tensor_hash,
                         sd_dir=stack.sd_dir, backend=name, job=f"dpobs-{name}")
            with BackendLog(logs, name) as log:
                return measure(stack, cfg, log.err)

        results = measure_each(names, one)
    if not results:
        raise SystemExit("dpobs compare: no backend ran; the lines above say why")
    return results


def measure_each(names: list[str], one) -> dict[str, dict]:
    """one(name) for each backend; one that cannot start, or fails, costs one line and the
    others still make the table (their results are not thrown away)."""
    results = {}
    for name in names:
        try:
            results[name] = one(name)
        except BackendUnavailable as exc:
            print(f"dpobs compare: skipping {name}: {exc}", file=sys.stderr)
        except Exception as exc:  # its log's tail is printed (logs.BackendLog)
            print(f"dpobs compare: {name} failed ({start_failure(exc)}); the table shows the "
                  "rest", file=sys.stderr)
    return results


def run(args) -> int:
    print(table(collect(args)), flush=True)
    return 0
