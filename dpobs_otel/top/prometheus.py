"""The answers from a Prometheus that loads the mixin's recording rules: every number is a
recording rule's value (DESIGN.md "Recording rules"), read with instant queries, so `dpobs
top` shows exactly what the dashboards and alerts read. Firing alerts come from the same
Prometheus's /api/v1/alerts."""
from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request

from .model import Alert, Answers, Job, Op, Process, worst_first

OP = "dpobs_client_operation_duration_seconds"
JOB_RULES = {  # Job attribute -> the recording rule (one series per job)
    "frac_of_step": "job:dpobs_frac_of_step:ratio_rate5m",
    "max_frac_of_step": "job:dpobs_frac_of_step:max_ratio_rate5m",
    "outstanding_bytes": "job:dpobs_client_outstanding_size_bytes:sum",
    "guard_checked": "job:dpobs_guard_rows_checked:increase5m",
    "guard_mismatched": "job:dpobs_guard_rows_mismatched:increase5m",
}
OP_RULES = {  # Op attribute -> the recording rule (one series per job and op)
    "share": "job_op:dpobs_operation_share:ratio_rate5m",
    "ops_per_s": "job_op:dpobs_client_operations:rate5m",
    "mean_s": f"job_op:{OP}:mean_rate5m",
    "p90_s": f'job_op:{OP}:quantile_rate5m{{quantile="0.9"}}',
    "p99_s": f'job_op:{OP}:quantile_rate5m{{quantile="0.99"}}',
}
BYTES = "sum by (job, direction) (job_op_direction:dpobs_client_transferred_bytes:rate5m)"
PER_PROCESS = "instance:dpobs_frac_of_step:ratio_rate5m"
# Every target that serves dpobs series carries role (file_sd or scrape config labels).
TARGETS = 'up{role!=""}'
WINDOW_S = 300.0  # the rules' 5m


class PrometheusError(RuntimeError):
    pass


class PrometheusSource:
    def __init__(self, url: str, timeout: float = 5.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def describe(self) -> str:
        return f"prometheus {self.url} (recording rules, 5m windows)"

    def _get(self, path: str, **params) -> dict:
        full = f"{self.url}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(full, timeout=self.timeout) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # a bad query: Prometheus explains in the body
            try:
                body = json.load(e)
            except ValueError:
                raise PrometheusError(f"{path}: HTTP {e.code}") from None
        except (OSError, ValueError) as e:
            raise PrometheusError(f"{self.url} unreachable: {e}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[tuple[dict, float]]:
        data = self._get("/api/v1/query", query=expr)
        return [(r["metric"], float(r["value"][1])) for r in data.get("result", [])]

    def answers(self) -> Answers:
        now = time.time()
        try:
            procs = self._processes()
            jobs = self._jobs({p.job for p in procs})
            alerts = self._alerts()
        except PrometheusError as e:
            return Answers(self.describe(), None, now, error=str(e))
        return Answers(self.describe(), WINDOW_S, now, worst_first(procs), jobs, alerts)

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
        names = seen | {j for d in per_job.values() for j in d} | {j for j, _ in per_op}
        jobs = []
        for name in sorted(names):
            j = Job(job=name, read_bytes_per_s=bytes_.get((name, "read")),
                    write_bytes_per_s=bytes_.get((name, "write")),
                    ops=sorted((o for (jn, _), o in per_op.items() if jn == name),
                               key=lambda o: (-(o.share or 0.0), o.op)))
            for attr, values in per_job.items():
                setattr(j, attr, values.get(name))
            jobs.append(j)
        return jobs

    def _alerts(self) -> list[Alert]:
        out = []
        for a in self._get("/api/v1/alerts").get("alerts", []):
            if a.get("state") != "firing":
                continue
            labels = dict(a.get("labels", {}))
            out.append(Alert(name=labels.pop("alertname", "?"),
                             severity=labels.pop("severity", ""), labels=labels,
                             summary=a.get("annotations", {}).get("summary", "")))
        rank = {"critical": 0, "warning": 1, "info": 2}
        return sorted(out, key=lambda a: (rank.get(a.severity, 3), a.name))
