"""Where the cluster view (cluster.py) reads every process's cumulative counters from: a
file_sd directory (FileSDSource: each listed endpoint scraped at the call) or a Prometheus
(PrometheusSource: the latest raw samples of every process, from the Prometheus the agents
remote-write to, or the one that scrapes the processes). Each read is a `Reading`.

The Prometheus source makes three instant queries per read: every dpobs_* and target_info
series of the job, `up` (a process whose last scrape failed is unreachable) and
`timestamp(up)` (when each process was last scraped: staleness_s is the oldest of those,
against the call's wall clock). Samples lag the processes by up to one scrape interval plus
the remote-write delay, so a window there is a window of scrapes, not of the calls;
consecutive calls still tile time without gaps or overlap, since each difference starts
where the last one ended.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..names import OP_DURATION_NATIVE_SERIES, STORE_ROLES
from . import protobody, scrape
from .native import NativeHistogram
from .prometheus import Prometheus, PrometheusError
from .scrape import PROCESS_LABELS, ProcessTotals, totals_from_samples


@dataclass
class Seen:
    """One process as one read found it: totals None when listed but unanswered."""
    labels: dict[str, str]  # job, node, instance, role, rank
    totals: ProcessTotals | None
    incarnation: str | None = None
    error: BaseException | None = None
    # op -> its cumulative native op-duration histogram; None when not read (a Prometheus
    # source, or an endpoint that answered in text), {} when the endpoint serves none
    native: dict[str, NativeHistogram] | None = None


@dataclass
class Reading:
    processes: dict[tuple, Seen]
    lost: set[tuple]  # listed, but certainly dead (a file_sd file nobody holds)
    staleness_s: float | None = None


class FileSDSource:
    """Reads by scraping every endpoint a file_sd directory lists, at the call, in one
    request each (protobody.read): the protobuf exposition, the counters and the native
    op-duration histograms from the same body, so from the same moment; an endpoint that
    answers in text (no protobuf exposition) gives its counters and no native histograms.
    Each request has the endpoint collect and render everything it exports, which is most
    of what a call costs: one request, not one per exposition."""

    def __init__(self, sd_dir: str, job: str | None = None, timeout: float = 1.0,
                 ssl_context=None):
        self.sd_dir, self.job, self.timeout, self.ssl_context = sd_dir, job, timeout, ssl_context
        self._pool: ThreadPoolExecutor | None = None  # made at the first call, then kept

    def read(self) -> Reading:
        listed: dict[tuple, scrape.Target] = {}
        dead = set()
        for t in scrape.targets(self.sd_dir, self.job):
            if t.alive is False:
                dead.add(t.process)
            elif listed.get(t.process) is None or t.alive:  # a live file wins a dead one
                listed[t.process] = t
        if self._pool is None:
            self._pool = ThreadPoolExecutor(32, thread_name_prefix="dpobs-cluster")
        got = scrape.scrape_all(list(listed.values()), self.timeout, self.ssl_context,
                                pool=self._pool, how=protobody.read)
        out = {}
        for key, t in listed.items():
            r = got[t]
            labels = dict(zip(PROCESS_LABELS, key))
            if isinstance(r, BaseException):
                out[key] = Seen(labels, None, t.incarnation, r)
            else:
                out[key] = Seen(labels, r[0], t.incarnation, native=r[1])
        return Reading(out, dead - set(out))


class PrometheusSource:
    """Reads the latest raw samples of every process of `job` (None: every job)."""

    def __init__(self, url: str, job: str | None = None, timeout: float = 2.0,
                 ssl_context=None):
        self.prom = Prometheus(url, timeout, ssl_context)
        self.job = job

    def read(self) -> Reading:
        m = f'job="{self.job}"' if self.job is not None else 'job=~".+"'
        # not the stores' own exporters (a Ray node, TransferQueue's controller): up, no
        # dpobs series, they would read as processes that serve nothing
        m += f', role!~"{"|".join(sorted(STORE_ROLES))}"'
        # float samples only: the native histogram (a Prometheus with native histograms on)
        # is not a ProcessTotals input
        series = self.prom.query(f'{{__name__=~"dpobs_.+|target_info", '
                                 f'__name__!="{OP_DURATION_NATIVE_SERIES}", {m}}}')
        up = {_key(r["metric"]): r["value"] for r in self.prom.query(f"up{{{m}}}")}
        seen_at = {_key(r["metric"]): r["value"]
                   for r in self.prom.query(f"timestamp(up{{{m}}})")}
        now = time.time()
        samples: dict[tuple, list] = {}
        for r in series:
            metric = r["metric"]
            samples.setdefault(_key(metric), []).append(
                (metric.get("__name__", ""), metric, r["value"]))
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


def source_for(source, job: str | None, timeout: float, ssl_context=None):
    """A Prometheus URL (http:// or https://; its certificate checked against the system's
    CAs) or a file_sd directory (its endpoints over https when ssl_context is given)."""
    if isinstance(source, str) and source.startswith(("http://", "https://")):
        return PrometheusSource(source, job, timeout)
    return FileSDSource(str(source), job, timeout, ssl_context)
