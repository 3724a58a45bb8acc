"""`dpobs demo`: the GRPO-shaped workload (workload.py) in several processes, optionally
scraped by a private Prometheus with the deploy/ rules and alerting through Alertmanager
(testing/stack.py); at the end, the workload's own truth beside what the metrics say."""
from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from .. import names as nm
from ..readback import native
from ..readback.buckets import quantile as bucket_quantile  # histogram_quantile, {le: count}
from ..readback.cluster import ClusterView, text as cluster_text
from .logs import BackendLog, log_dir
from ..report.command import demo_png
from ..tracing.command import demo_outputs
from .progress import Progress
from ..testing.stack import Stack, binaries
from .backends import BackendUnavailable, available
from .batches import Config
from .critical import critical_path_lines
from .queue import check_queue, queue_lines
from .truth import dp_seconds, frac_of_step, merge, op_shares, quantile  # noqa: F401 (API)
from . import ray_report, store_report
from .guard_report import guard_line
from .ray_plane import RayWorkload
from .weightsync_report import stack_mixin, weight_config, weight_lines
from .workload import Workload

MB = 1e6


def config(args) -> Config:
    if args.trainers < 1 or args.batch_size < args.trainers:
        raise SystemExit("dpobs demo: need --trainers >= 1 and --batch-size >= --trainers")
    if not 1 <= args.min_len <= args.max_len:
        raise SystemExit("dpobs demo: need 1 <= --min-len <= --max-len")
    if args.rollout_ms < 0 or args.train_ms < 0:
        raise SystemExit("dpobs demo: --rollout-ms and --train-ms cannot be negative")
    check_queue(args)
    if args.backend == "ray":
        ray_report.refuse(args)
    missing = available(args.backend)
    if missing:
        raise SystemExit(f"dpobs demo: --backend {args.backend} cannot run here: {missing}")
    return Config(steps=args.steps, trainers=args.trainers, batch_size=args.batch_size,
                  min_len=args.min_len, max_len=args.max_len, duration=args.duration,
                  latency_s=args.store_latency_ms / 1e3, verify=args.verify_tensor_hash,
                  corrupt_at=args.corrupt_at_step, seed=args.seed, job=args.job, trace=args.trace,
                  sd_dir=args.sd_dir, host=args.host, advertise_host=args.advertise_host,
                  backend=args.backend, async_k=args.async_k, row_age=args.row_age,
                  prefetch=args.prefetch, rollout_ms=args.rollout_ms, train_ms=args.train_ms,
                  **weight_config(args), **store_report.store_config(args),
                  **ray_report.ray_config(args))


# -- a run, kept up while its results are read --------------------------------------------
@dataclass
class Result:
    info: dict  # (role, rank) -> endpoint, instance, pid
    warm: dict  # (role, rank) -> truth of the warm-up step
    truth: dict  # (role, rank) -> truth of the measured steps
    scraped: dict  # (role, rank) -> [(name, labels, value)] from its /metrics at the end
    cluster: tuple | None = None  # (dict, (columns, rows)): the measured steps' cluster view
    native: dict | None = None  # (role, rank) -> {(family, labels): NativeHistogram}

    def total(self, key) -> dict:
        """Warm-up plus measured steps: what a process's counters hold."""
        return merge([self.warm[key], self.truth[key]])


@contextlib.contextmanager
def session(cfg: Config, stack: Stack | None = None, on_ready=None, on_step=None,
            cluster_log=None):
    """Run the workload to the end and yield a Result while every process is still up (and,
    with a stack, after Prometheus has scraped and evaluated the final state). With
    `cluster_log` (an open text file) and a file_sd directory, every step's cluster dict is
    appended to it as a JSON line, the way a driver would log it."""
    with (RayWorkload if cfg.backend == "ray" else Workload)(cfg) as wl:
        if on_ready is not None:
            on_ready(wl)
        instances = [i["instance"] for i in wl.info.values()] + store_report.instances(cfg)
        wl.warmup()
        if stack is not None:  # rates then start at this quiescent, post-warm-up sample
            store_report.settle(cfg)
            stack.wait_scraped(instances, after=time.time())
        view = ClusterView(cfg.sd_dir, cfg.job) if cfg.sd_dir else None
        if view is not None:
            view.step_metrics()  # the baseline: every process at rest after the warm-up
        if view is not None and cluster_log is not None:
            on_step = _logging_cluster(ClusterView(cfg.sd_dir, cfg.job), cluster_log, on_step)
        wl.run(on_step)
        cluster = (view.step_metrics(), view.breakdown()) if view is not None else None
        if stack is not None:
            store_report.settle(cfg)
            stack.wait_scraped(instances, after=time.time())
            stack.wait_evaluated(after=time.time())
        scraped = {k: scrape(i["endpoint"]) for k, i in wl.info.items()}
        hists = {k: native.fetch(_local(i["endpoint"]), timeout=10) for k, i in wl.info.items()}
        yield Result(dict(wl.info), dict(wl.warm), dict(wl.truth), scraped, cluster, hists)


def _logging_cluster(view: ClusterView, out, on_step):
    """on_step, plus one cluster dict per step written to `out` as a JSON line."""
    view.step_metrics()  # baseline

    def step(n, *rest):
        if on_step is not None:
            on_step(n, *rest)
        out.write(json.dumps({"step": n, **view.step_metrics()}) + "\n")
        out.flush()
    return step


def _local(endpoint: str) -> str:  # a wildcard bind's endpoint as this machine reaches it
    host, port = endpoint.rsplit(":", 1)
    return f'{ {"0.0.0.0": "127.0.0.1", "[::]": "[::1]"}.get(host, host)}:{port}'


def scrape(endpoint: str) -> list[tuple[str, dict, float]]:
    with urllib.request.urlopen(f"http://{_local(endpoint)}/metrics", timeout=10) as r:
        return parse_metrics(r.read().decode())


def parse_metrics(text: str) -> list[tuple[str, dict, float]]:
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text)
            for s in fam.samples]


def metric_ops(samples) -> dict[str, dict]:
    """Per op from scraped samples: calls, seconds, cumulative buckets, bytes."""
    ops: dict[str, dict] = {}
    for name, labels, value in samples:
        op = labels.get("op")
        if op is None or not name.startswith("dpobs_client_"):
            continue
        o = ops.setdefault(op, {"calls": 0, "seconds": 0.0, "buckets": {}, "bytes": 0})
        if name == f"{nm.OP_DURATION_SERIES}_count":
            o["calls"] += value
        elif name == f"{nm.OP_DURATION_SERIES}_sum":
            o["seconds"] += value
        elif name == f"{nm.OP_DURATION_SERIES}_bucket":
            le = float(labels["le"])
            o["buckets"][le] = o["buckets"].get(le, 0) + value
        elif name == nm.TRANSFERRED_SERIES:
            o["bytes"] += value
    return ops


def metric_sum(samples, name: str) -> float:
    return sum(v for n, _, v in samples if n == name)


# -- the report ----------------------------------------------------------------------------
def verdict_line(res: Result, stack: Stack | None, cfg: Config) -> str:
    """The job's one-line verdict (readback/headline.py), the sentence `dpobs report` and
    `dpobs top` print: from the recording rules with a stack, else from the workload's own
    clock over the measured steps and the processes' guard counters."""
    from ..config import Settings
    from ..readback import headline
    from ..report.command import verdict
    if stack is not None:
        try:
            return "Verdict: " + verdict(stack.prometheus, None, cfg.job or Settings.job)
        except Exception as exc:  # the tables below still hold the answer
            return f"Verdict: none from Prometheus ({type(exc).__name__}: {exc})"
    keys = [k for k in res.info if k[0] != cfg.unmeasured]
    measured = merge(res.truth[k] for k in keys)
    samples = [s for k in keys for s in res.scraped[k]]
    step_s = measured["step_s"]
    guarded = cfg.verify and any(n == nm.GUARD_CHECKED_SERIES for n, _, _ in samples)
    said = headline.from_parts(
        frac_of_step(measured), measured["exposed_s"] / step_s if step_s else None,
        op_shares(measured), {headline.who({"role": k[0], "rank": k[1]}):
                              frac_of_step(res.truth[k]) for k in keys},
        metric_sum(samples, nm.GUARD_CHECKED_SERIES) if guarded else None,
        metric_sum(samples, nm.GUARD_MISMATCHED_SERIES) if guarded else None)
    return "Verdict (the workload's own clock, no Prometheus): " + headline.sentence(said)


def report(res: Result, stack: Stack | None, cfg: Config) -> str:
    if cfg.backend == "ray":  # the Ray truth has its own shape: the rules' verdict only
        head = [verdict_line(res, stack, cfg)] if stack is not None else []
        return "\n".join(head + [ray_report.report(res, cfg, stack)])
    keys = [k for k in res.info if k[0] != cfg.unmeasured]  # dpobs's numbers: theirs only
    total = merge(res.total(k) for k in keys)
    measured = merge(res.truth[k] for k in keys)
    samples = [s for k in keys for s in res.scraped[k]]
    mops = metric_ops(samples)
    lines = [verdict_line(res, stack, cfg),
             "\nData-plane ops, all processes, every step (truth: the workload's own clock and "
             "byte count; native: their native histograms merged; classic, where no native: "
             "interpolated between the bucket bounds shown under it), worst first"]
    lines.append(f"  {'op':<10}{'source':<9}{'calls':>7}{'mean ms':>9}{'p50':>8}{'p90':>8}"
                 f"{'p99':>8}{'MB':>10}{'share':>8}")
    dp_t = dp_seconds(total)
    dp_m = sum(o["seconds"] for o in mops.values())
    for op in sorted(total["ops"], key=lambda o: -total["ops"][o].total):
        d = total["ops"][op]
        nbytes = sum(v for (o, _), v in total["bytes"].items() if o == op)
        lines.append(_oprow(op, "truth", len(d), d.total, [quantile(d, q) for q in
                            (0.5, 0.9, 0.99)], nbytes, d.total / dp_t))
        m = mops.get(op, {"calls": 0, "seconds": 0.0, "buckets": {}, "bytes": 0})
        h = native.pooled((res.native or {}).values(), nm.OP_DURATION_NATIVE_SERIES, op=op)
        share = m["seconds"] / dp_m if dp_m else 0.0
        if h is not None:
            lines.append(_oprow("", "native", h.count, h.sum,
                                [h.quantile(q) for q in (0.5, 0.9, 0.99)], m["bytes"], share))
        else:
            lines += _classic_rows(m, share)
    prom = {r["metric"].get("instance"): r["value"]
            for r in (stack.query(nm.INSTANCE_FRAC_OF_STEP) if stack is not None else ())}
    lines.append("\nProcesses, worst first: fraction of step time in the data plane "
                 "(every step | measured steps, the ones Prometheus rates)")
    lines.append(f"  {'process':<12}{'instance':<22}{'steps':>6}{'step s':>8}{'truth':>9}"
                 f"{'metrics':>9}  |{'truth':>8}{'prometheus':>12}")
    for k in sorted(keys, key=lambda k: -frac_of_step(res.total(k))):
        t, s = res.total(k), res.scraped[k]
        step_m = metric_sum(s, f"{nm.STEP_DURATION_SERIES}_sum")
        dp_m = metric_sum(s, f"{nm.OP_DURATION_SERIES}_sum")
        p = prom.get(res.info[k]["instance"])
        lines.append(f"  {k[0] + ' ' + str(k[1]):<12}{res.info[k]['instance']:<22}"
                     f"{t['steps']:>6}{t['step_s']:>8.1f}{frac_of_step(t):>9.1%}"
                     f"{dp_m / step_m if step_m else 0:>9.1%}  |"
                     f"{frac_of_step(res.truth[k]):>8.1%}"
                     f"{'-' if p is None else format(p, '.1%'):>12}")
    lines += critical_path_lines(res, stack)
    lines += queue_lines(res, cfg) + [guard_line(samples, cfg)] + weight_lines(res, stack, cfg)
    lines += store_report.store_lines(res, stack, cfg)
    if res.cluster is not None:
        lines += _cluster_lines(*res.cluster)
    if stack is not None:
        lines += _prometheus_lines(stack, measured, cfg)
    return "\n".join(lines)


def _classic_rows(m: dict, share: float) -> list[str]:
    """The classic buckets' row and, under its percentiles, the bucket bound each lies
    below: a classic percentile is a guess within its bucket, not a measured latency."""
    qs = [bucket_quantile(m["buckets"], q) for q in (0.5, 0.9, 0.99)]
    bounds = [min((le for le in m["buckets"] if le >= q), default=float("inf")) for q in qs]
    return [_oprow("", "classic", m["calls"], m["seconds"], qs, m["bytes"], share),
            f"  {'':<10}{'bound <=':<25}" + "".join(f"{b * 1e3:>8g}" for b in bounds)]


MAX_BOUND = "max_le_ms"  # the cluster view's max_ms, named for what it is


def _cluster_lines(got: dict, table) -> list[str]:
    """The cluster view, its max_ms column named as the bucket bound it is."""
    columns, rows = table
    columns = [MAX_BOUND if c == "max_ms" else c for c in columns]
    return ["\nCluster view (tel.cluster_step_metrics(sd_dir), the measured steps)",
            cluster_text(got, (columns, rows)),
            f"  {MAX_BOUND}: the upper bound of the highest bucket a call reached (the slowest "
            "call took at most this long): a bucket bound, not a measured maximum"]


def _oprow(op, source, calls, seconds, qs, nbytes, share) -> str:
    mean = seconds / calls * 1e3 if calls else float("nan")
    q = "".join(f"{x * 1e3:>8.2f}" for x in qs)
    return (f"  {op:<10}{source:<9}{int(calls):>7}{mean:>9.2f}{q}{nbytes / MB:>10.2f}"
            f"{share:>8.1%}")


def _prometheus_lines(stack: Stack, measured: dict, cfg: Config) -> list[str]:
    def one(expr):
        r = stack.query(expr)
        return r[0]["value"] if r else float("nan")

    rows: list[tuple[str, str, str]] = []  # (rule with its labels, prometheus, truth)

    def row(label, value, truth, fmt="{:.4f}"):
        rows.append((label, fmt.format(value), fmt.format(truth)))

    row(nm.JOB_FRAC_OF_STEP, one(nm.JOB_FRAC_OF_STEP), frac_of_step(measured))
    shares = op_shares(measured)
    for op in sorted(shares, key=lambda o: -shares[o]):
        share = f'{nm.JOB_OP_SHARE}{{op="{op}"}}'
        row(share, one(share), shares[op])
        d = measured["ops"][op]
        for q in ("0.5", "0.99"):
            sel = f'{{op="{op}",quantile="{q}"}}'
            rule, how = nm.JOB_OP_NATIVE_QUANTILE, "native"
            value = 1e3 * one(rule + sel)
            if value != value:  # no native histograms: the classic buckets' guess
                rule, how = nm.JOB_OP_QUANTILE, "classic, within a bucket's bounds"
                value = 1e3 * one(rule + sel)
            row(f"{rule}{sel} (ms, {how})", value, 1e3 * quantile(d, float(q)), "{:.2f}")
    for (op, direction), n in sorted(measured["bytes"].items()):
        calls = len(measured["ops"].get(op, ()))
        sel = f'{{op="{op}",direction="{direction}"}}'
        per_call = one(f"{nm.JOB_OP_DIRECTION_BYTES}{sel}"
                       f' / ignoring(direction) {nm.JOB_OP_RATE}{{op="{op}"}}')
        row(f"bytes per {op} call, {direction} (transferred_bytes:rate5m / operations:rate5m)",
            per_call, n / calls if calls else float("nan"), "{:.0f}")
    width = max(len(r[0]) for r in rows) + 2  # every rule's whole name, never cut
    lines = ["\nPrometheus recording rules (5m windows) beside the truth of the measured "
             "steps (the classic buckets' quantiles only where no native histogram is)",
             f"  {'rule':<{width}}{'prometheus':>12}{'truth':>12}"]
    lines += [f"  {label:<{width}}{value:>12}{truth:>12}" for label, value, truth in rows]
    alerts = [_alert(a["labels"]) for a in stack.wait_alerts(cfg.faults_alert())]
    lines.append("\nAlertmanager: " + ("; ".join(alerts) or "no alerts"))
    return lines


def _alert(labels: dict) -> str:
    where = " ".join(labels[k] for k in ("role", "rank") if k in labels)
    what = [f"{k} {labels[k]}" for k in ("field", "reason", "op") if k in labels]
    detail = ", ".join(x for x in (where, *what) if x)
    return f"{labels['alertname']} {labels.get('severity', '')}" + (f" ({detail})" if detail
                                                                      else "")


# -- the command ---------------------------------------------------------------------------
# The Debian packages of the demo's stack (testing/stack.binaries finds their binaries).
STACK_PACKAGES = "prometheus prometheus-alertmanager"
NO_PICTURE = ("No picture: the demo ran without Prometheus and without --sd-dir; for one, "
              f"apt install {STACK_PACKAGES} (the demo then starts them) or rerun with "
              "--sd-dir DIR (the picture from the processes' own endpoints)")


def picture(stack, cfg: Config, folder, out) -> None:
    """The answers as a PNG in the run's folder, or the line that says how to get one."""
    if stack is None and not cfg.sd_dir:
        print(NO_PICTURE, file=out)
        return
    demo_png(stack and stack.prometheus, cfg.sd_dir, cfg.job, folder, out)


def run(args) -> int:
    cfg = config(args)
    if cfg.corrupt_at is not None and not cfg.verify:
        print("note: --corrupt-at-step without --verify-tensor-hash: nothing will notice",
              file=sys.stderr)
    state = {"wl": None, "running": False, "out": sys.stdout, "err": sys.stderr}

    def on_signal(signum, frame):
        wl = state["wl"]
        if state["running"] and wl is not None and not wl.sync.stop.is_set():
            print("\nstopping after this step (again to abort)", file=state["err"])
            wl.stop()
        else:
            raise KeyboardInterrupt

    def on_ready(wl):
        state["wl"] = wl
        for (role, rank), i in wl.info.items():
            print(f"  {role} {rank}: http://{i['endpoint']}/metrics  (pid {i['pid']})",
                  file=state["out"])
        print("warming up, then measuring ...", file=state["out"], flush=True)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with contextlib.ExitStack() as es:
            stack = None
            if args.stack == "auto":
                missing = [n for n, p in binaries().items() if p is None]
                if missing:
                    print(f"--stack auto: {', '.join(missing)} not on PATH; running without "
                          f"Prometheus (for it: apt install {STACK_PACKAGES})", file=sys.stderr)
                else:
                    mixin = store_report.stack_mixin(cfg, stack_mixin(cfg))
                    stack = es.enter_context(Stack(sd_dir=args.sd_dir, mixin=mixin))
                    cfg.sd_dir = stack.sd_dir
                    print(f"Prometheus   {stack.prometheus}\nAlertmanager "
                          f"{stack.alertmanager}\nfile_sd      {stack.sd_dir}")
            log = es.enter_context(open(args.cluster_log, "a")) if args.cluster_log else None
            backend = es.enter_context(BackendLog(log_dir(args.log_dir), cfg.backend))
            state.update(out=backend.out, err=backend.err, running=True)
            progress = Progress(cfg, stream=backend.err)
            with session(cfg, stack, on_ready, progress, log) as res:
                state["running"] = False
                progress.finish()
                print(report(res, stack, cfg), file=backend.out, flush=True)
                demo_outputs(cfg, res.info, backend.path.parent, backend.out)
                picture(stack, cfg, backend.path.parent, backend.out)
    except KeyboardInterrupt:
        print("\ninterrupted; everything started is stopped", file=sys.stderr)
        return 130
    except BackendUnavailable as exc:
        print(f"dpobs demo: --backend {cfg.backend} cannot start: {exc}", file=sys.stderr)
        return 1
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return 0
