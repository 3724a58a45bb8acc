"""The answers from a Prometheus that loads the mixin's recording rules: every number is a
recording rule's value (DESIGN.md "Recording rules"), read with instant queries, so `dpobs
top` shows exactly what the dashboards and alerts read. Firing alerts come from the same
Prometheus's /api/v1/alerts."""
from __future__ import annotations

import math
import time

from .. import names
from ..readback import verdict
from ..readback.prometheus import Prometheus, PrometheusError
from . import ray, store, weights
from .model import Alert, Answers, Job, Op, Process, stragglers, worst_first

JOB_RULES = {  # Job attribute -> the recording rule (one series per job)
    "frac_of_step": names.JOB_FRAC_OF_STEP,
    "max_frac_of_step": names.JOB_MAX_FRAC_OF_STEP,
    "busy_frac": names.JOB_BUSY_FRAC_OF_STEP,
    "exposed_frac": names.JOB_EXPOSED_FRAC_OF_STEP,
    "max_exposed_frac": names.JOB_MAX_EXPOSED_FRAC_OF_STEP,
    "outstanding_bytes": names.JOB_OUTSTANDING_BYTES,
    "guard_checked": names.JOB_GUARD_CHECKED,
    "guard_mismatched": names.JOB_GUARD_MISMATCHED,
}
OP_RULES = {  # Op attribute -> the recording rule (one series per job and op)
    "share": names.JOB_OP_SHARE,
    "ops_per_s": names.JOB_OP_RATE,
    "mean_s": names.JOB_OP_MEAN,
    "p90_s": f'{names.JOB_OP_QUANTILE}{{quantile="0.9"}}',
    "p99_s": f'{names.JOB_OP_QUANTILE}{{quantile="0.99"}}',
}
# Preferred over the classic p90/p99 wherever the native rule has a value (a Prometheus with
# native histograms on); the classic ones answer elsewhere, and Op.quantiles says which.
NATIVE_QUANTILES = {
    "p90_s": f'{names.JOB_OP_NATIVE_QUANTILE}{{quantile="0.9"}}',
    "p99_s": f'{names.JOB_OP_NATIVE_QUANTILE}{{quantile="0.99"}}',
}
BYTES = f"sum by (job, direction) ({names.JOB_OP_DIRECTION_BYTES})"
PER_PROCESS = names.INSTANCE_FRAC_OF_STEP
PROCESS_RULES = {  # Process attribute -> the recording rule (one series per process)
    "busy_frac": names.INSTANCE_BUSY_FRAC_OF_STEP,
    "exposed_frac": names.INSTANCE_EXPOSED_FRAC_OF_STEP,
}
# Every target that serves dpobs series carries role (file_sd or scrape config labels); the
# stores' own exporters (a Ray node's, TransferQueue's controller) carry one too, and are
# not processes of the job.
TARGETS = f'up{{role!="", role!~"{"|".join(sorted(names.STORE_ROLES))}"}}'
WINDOW_S = 300.0  # the rules' 5m


class RulesSource:
    """top's answers from the recording rules of the Prometheus at `url`."""

    def __init__(self, url: str, timeout: float = 5.0):
        self.prom = Prometheus(url, timeout)

    def describe(self) -> str:
        return f"prometheus {self.prom.url} (recording rules, 5m windows)"

    def query(self, expr: str) -> list[tuple[dict, float]]:
        return [(r["metric"], r["value"]) for r in self.prom.query(expr)]

    def answers(self) -> Answers:
        now = time.time()
        try:
            procs = self._processes()
            jobs = self._jobs({p.job for p in procs})
            alerts = self._alerts()
            slow = stragglers(self.query(names.INSTANCE_OP_MEAN))
            lines = weights.judged(weights.from_prometheus(self.query))
            account = store.from_prometheus(self.query)
            ray_account = ray.from_prometheus(self.query)
        except PrometheusError as e:
            return Answers(self.describe(), None, now, error=str(e))
        return Answers(self.describe(), WINDOW_S, now, worst_first(procs), jobs, alerts, slow,
                       weights=lines, store=account, ray=ray_account)

    def _processes(self) -> list[Process]:
        def key(m: dict) -> tuple:
            return (m.get("job", ""), m.get("node", ""), m.get("instance", ""), m.get("role", ""))
        fracs = {key(m): v for m, v in self.query(PER_PROCESS) if math.isfinite(v)}
        procs = {}
        for m, v in self.query(TARGETS):
            procs[key(m)] = Process(job=m.get("job", ""), instance=m.get("instance", ""),
                                    role=m.get("role", ""), rank=m.get("rank", ""),
                                    node=m.get("node", ""), up=v == 1,
                                    frac_of_step=fracs.get(key(m)) if v == 1 else None,
                                    error="" if v == 1 else "scrape failed")
        for k, v in fracs.items():  # a rule series whose target has gone: still an answer
            if k not in procs:
                procs[k] = Process(job=k[0], node=k[1], instance=k[2], role=k[3], frac_of_step=v)
        for attr, expr in PROCESS_RULES.items():
            for m, v in self.query(expr):
                p = procs.get(key(m))
                if p is not None and p.up and math.isfinite(v):
                    setattr(p, attr, v)
        return list(procs.values())

    def _by_job(self, expr: str) -> dict[str, float]:
        return {m.get("job", ""): v for m, v in self.query(expr) if math.isfinite(v)}

    def _jobs(self, seen: set[str]) -> list[Job]:
        per_job = {attr: self._by_job(expr) for attr, expr in JOB_RULES.items()}
        bytes_ = {(m.get("job", ""), m.get("direction", "")): v for m, v in self.query(BYTES)}
        per_op: dict[tuple[str, str], Op] = {}
        for attr, expr in OP_RULES.items():
            for m, v in self.query(expr):
                k = (m.get("job", ""), m.get("op", ""))
                o = per_op.setdefault(k, Op(op=k[1]))
                setattr(o, attr, v if math.isfinite(v) else None)
                if attr in NATIVE_QUANTILES and math.isfinite(v):
                    o.quantiles = "classic"
        for attr, expr in NATIVE_QUANTILES.items():
            for m, v in self.query(expr):
                o = per_op.get((m.get("job", ""), m.get("op", "")))
                if o is not None and math.isfinite(v):
                    setattr(o, attr, v)
                    o.quantiles = "native"
        queues = verdict.per_job_from_prometheus(self.query)
        names = (seen | {j for d in per_job.values() for j in d} | {j for j, _ in per_op}
                 | set(queues))
        jobs = []
        for name in sorted(names):
            j = Job(job=name, read_bytes_per_s=bytes_.get((name, "read")),
                    write_bytes_per_s=bytes_.get((name, "write")),
                    ops=sorted((o for (jn, _), o in per_op.items() if jn == name),
                               key=lambda o: (-(o.share or 0.0), o.op)))
            for attr, values in per_job.items():
                setattr(j, attr, values.get(name))
            if name in queues:
                j.queue = verdict.verdict(verdict.from_processes(queues[name]))
            jobs.append(j)
        return jobs

    def _alerts(self) -> list[Alert]:
        out = []
        for a in self.prom.alerts():
            if a.get("state") != "firing":
                continue
            labels = dict(a.get("labels", {}))
            out.append(Alert(name=labels.pop("alertname", "?"),
                             severity=labels.pop("severity", ""), labels=labels,
                             summary=a.get("annotations", {}).get("summary", "")))
        rank = {"critical": 0, "warning": 1, "info": 2}
        return sorted(out, key=lambda a: (rank.get(a.severity, 3), a.name))
