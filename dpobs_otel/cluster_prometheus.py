"""The Prometheus-URL source of the cluster view (cluster.py): the latest raw samples of
every process, from the HTTP API of the Prometheus the agents remote-write to (or the one
that scrapes the processes).

Three instant queries per call: every dpobs_* and target_info series of the job, `up` (a
process whose last scrape failed is unreachable) and `timestamp(up)` (when each process
was last scraped: the dict's staleness_s is the oldest of those, against the call's wall
clock). Samples lag the processes by up to one scrape interval plus the remote-write delay,
so a window here is a window of scrapes, not of the calls; consecutive calls still tile
time without gaps or overlap, since each difference starts where the last one ended.
"""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request

from .cluster import Reading, Seen
from .scrape import PROCESS_LABELS, totals_from_samples


class PrometheusError(RuntimeError):
    pass


class PrometheusSource:
    def __init__(self, url: str, job: str | None = None, timeout: float = 2.0,
                 ssl_context=None):
        self.url = url.rstrip("/")
        self.job, self.timeout, self.ssl_context = job, timeout, ssl_context

    def query(self, expr: str) -> list[dict]:
        """An instant query's vector: [{"metric": {...}, "value": [ts, "v"]}, ...]."""
        full = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(full, timeout=self.timeout,
                                    context=self.ssl_context) as r:
            body = json.load(r)
        if body.get("status") != "success" or body["data"]["resultType"] != "vector":
            raise PrometheusError(f"{expr}: {body.get('error', body)}")
        return body["data"]["result"]

    def _matcher(self) -> str:
        return f'job="{self.job}"' if self.job is not None else 'job=~".+"'

    def read(self) -> Reading:
        m = self._matcher()
        series = self.query(f'{{__name__=~"dpobs_.+|target_info", {m}}}')
        up = {_key(r["metric"]): float(r["value"][1]) for r in self.query(f"up{{{m}}}")}
        seen_at = {_key(r["metric"]): float(r["value"][1])
                   for r in self.query(f"timestamp(up{{{m}}})")}
        now = time.time()
        samples: dict[tuple, list] = {}
        for r in series:
            metric = r["metric"]
            samples.setdefault(_key(metric), []).append(
                (metric.get("__name__", ""), metric, float(r["value"][1])))
        out = {}
        for key in set(samples) | set(up):
            labels = dict(zip(PROCESS_LABELS, key))
            if up.get(key, 1.0) == 0.0 or key not in samples:
                out[key] = Seen(labels, None, error=PrometheusError("up == 0"))
                continue
            out[key] = Seen(labels, totals_from_samples(samples[key], seen_at.get(key, now)))
        fresh = [seen_at[k] for k in out if k in seen_at and out[k].totals is not None]
        return Reading(out, set(), max(now - t for t in fresh) if fresh else None)


def _key(metric: dict) -> tuple:
    return tuple(metric.get(k, "") for k in PROCESS_LABELS)
